/* Llama 3: presets, parameter table, init, build, and the units' entry points, which run
 * the units' programs (llama_impl.h; the block is in llama_block.c, the embedding and the
 * head in llama_head.c). Reads top to bottom: configs, table, init, build, units. */
#include "model/llama/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "model/llama/llama_impl.h"

/* ---------------------------------------------------------------- configs */

struct llama_preset {
	const char *name;
	int64_t dim, n_layers, n_heads, n_kv_heads, vocab;
	double ffn_mult;
	int64_t multiple_of;
};

/* TorchTitan's llama3 flavors (debugmodel, 8B, 70B, 405B), Llama 3.2's 1B shapes (untied),
 * and a 125M-class model for CPU experiments. */
static const struct llama_preset llama_presets[] = {
    {"debugmodel", 256, 6, 16, 16, 2048, 0.0, 256}, {"125M", 768, 12, 12, 4, 8192, 0.0, 256},
    {"1B", 2048, 16, 32, 8, 128256, 1.5, 256},      {"8B", 4096, 32, 32, 8, 128256, 1.3, 1024},
    {"70B", 8192, 80, 64, 8, 128256, 1.3, 4096},    {"405B", 16384, 126, 128, 8, 128256, 1.2, 4096},
};

const char *llama_flavor_name(int i)
{
	return i >= 0 && i < (int)(sizeof(llama_presets) / sizeof(llama_presets[0]))
	           ? llama_presets[i].name
	           : NULL;
}

const char *llama_flavor_list(void)
{
	return "debugmodel, 125M, 1B, 8B, 70B, 405B";
}

int llama_config_finish(struct llama_config *c)
{
	if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
	    c->vocab_size <= 1 || c->multiple_of <= 0) {
		LOG_ERROR("model: dimensions must be positive");
		return CT_ERR_USAGE;
	}
	if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads || (c->dim / c->n_heads) % 2) {
		LOG_ERROR(
		    "model: dim %lld must divide into %lld heads of even size, and heads into "
		    "%lld kv heads",
		    (long long)c->dim, (long long)c->n_heads, (long long)c->n_kv_heads);
		return CT_ERR_USAGE;
	}
	c->head_dim = c->dim / c->n_heads;
	if (c->head_dim > ATTN_MAX_HEAD_DIM) {
		LOG_ERROR("model: head dim %lld exceeds %d", (long long)c->head_dim,
		          ATTN_MAX_HEAD_DIM);
		return CT_ERR_USAGE;
	}
	int64_t hidden = (int64_t)(8 * c->dim / 3);
	if (c->ffn_dim_multiplier > 0)
		hidden = (int64_t)(c->ffn_dim_multiplier * (double)hidden);
	c->ffn_hidden = (hidden + c->multiple_of - 1) / c->multiple_of * c->multiple_of;
	return CT_OK;
}

int llama_config_preset(struct llama_config *c, const char *flavor)
{
	for (size_t i = 0; i < sizeof(llama_presets) / sizeof(llama_presets[0]); i++) {
		const struct llama_preset *p = &llama_presets[i];
		if (strcmp(p->name, flavor) != 0)
			continue;
		memset(c, 0, sizeof(*c));
		snprintf(c->flavor, sizeof(c->flavor), "%s", p->name);
		c->dim = p->dim;
		c->n_layers = p->n_layers;
		c->n_heads = p->n_heads;
		c->n_kv_heads = p->n_kv_heads;
		c->vocab_size = p->vocab;
		c->ffn_dim_multiplier = p->ffn_mult;
		c->multiple_of = p->multiple_of;
		c->norm_eps = 1e-5;
		c->rope_theta = 500000.0;
		c->rope_scaling = false;
		c->rope_factor = 8.0;
		c->rope_low_freq_factor = 1.0;
		c->rope_high_freq_factor = 4.0;
		c->rope_original_ctx = 8192;
		return llama_config_finish(c);
	}
	LOG_ERROR("model.flavor: unknown flavor '%s' (choose from %s)", flavor,
	          llama_flavor_list());
	return CT_ERR_USAGE;
}

/* ---------------------------------------------------------------- parameter table */

/* Make the last added tensor the tensor-parallel piece `rank` of `size` along dim (0 rows,
 * 1 columns) of a global tensor of `global` rows or columns, split in ceil(global/size). */
static void table_split_last(struct param_table *t, int dim, int64_t global, int size, int rank)
{
	struct param_entry *p = &t->p[t->count - 1];
	int64_t piece = (global + size - 1) / size, start = (int64_t)rank * piece;
	p->tp_dim = dim;
	p->tp_start = start;
	p->tp_valid = start >= global ? 0 : (global - start < piece ? global - start : piece);
	p->global_shape[dim] = global;
}

int llama_table_build(struct param_table *t, const struct llama_config *c)
{
	return llama_table_build_tp(t, c, 1, 0);
}

/* The dimensions a block tensor's shape is made of. */
enum block_dim { BD_NONE, BD_C, BD_HD, BD_KVD, BD_F };

/* One block's tensors, in table order. tp: -1 replicated, 0 column-parallel (rows split),
 * 1 row-parallel (columns split). Init (TorchTitan's llama3, depth_init): norms 1; wq, wk,
 * wv, w1 trunc-normal std 0.02 cut at +-2 (absolute, torch's trunc_normal_ default); wo, w2,
 * w3 the same with std 0.02/sqrt(2(l+1)). */
static const struct block_tensor_spec {
	const char *suffix;
	enum block_dim rows, cols;
	int tp;
	bool norm, depth_init;
} block_spec[LB_COUNT] = {
    [LB_ATTN_NORM] = {"attention_norm.weight", BD_C, BD_NONE, -1, true, false},
    [LB_WQ] = {"attention.wq.weight", BD_HD, BD_C, 0, false, false},
    [LB_WK] = {"attention.wk.weight", BD_KVD, BD_C, 0, false, false},
    [LB_WV] = {"attention.wv.weight", BD_KVD, BD_C, 0, false, false},
    [LB_WO] = {"attention.wo.weight", BD_C, BD_HD, 1, false, true},
    [LB_FFN_NORM] = {"ffn_norm.weight", BD_C, BD_NONE, -1, true, false},
    [LB_W1] = {"feed_forward.w1.weight", BD_F, BD_C, 0, false, false},
    [LB_W2] = {"feed_forward.w2.weight", BD_C, BD_F, 1, false, true},
    [LB_W3] = {"feed_forward.w3.weight", BD_F, BD_C, 0, false, true},
};

static int64_t block_dim_size(const struct llama_config *c, enum block_dim d)
{
	switch (d) {
	case BD_C:
		return c->dim;
	case BD_HD:
		return c->n_heads * c->head_dim;
	case BD_KVD:
		return c->n_kv_heads * c->head_dim;
	case BD_F:
		return c->ffn_hidden;
	case BD_NONE:
		break;
	}
	return 0;
}

int llama_table_build_tp(struct param_table *t, const struct llama_config *c, int tp_size,
                         int tp_rank)
{
	memset(t, 0, sizeof(*t));
	if (tp_size > 1 &&
	    (c->n_heads % tp_size || c->n_kv_heads % tp_size || c->ffn_hidden % tp_size)) {
		LOG_ERROR(
		    "parallelism.tensor_parallel_degree = %d must divide model.n_heads (%lld), "
		    "n_kv_heads (%lld) and the FFN hidden size (%lld)",
		    tp_size, (long long)c->n_heads, (long long)c->n_kv_heads,
		    (long long)c->ffn_hidden);
		return CT_ERR_USAGE;
	}
	int cap = 0;
	int S = tp_size, R = tp_rank;
	t->tp_size = S;
	t->tp_rank = R;
	int64_t C = c->dim, V = c->vocab_size, Vs = (V + S - 1) / S;
	int L = (int)c->n_layers;
	t->n_units = L + 2;
	t->unit_begin = xcalloc((size_t)t->n_units + 1, sizeof(int64_t));
	char name[PARAM_NAME_MAX];
	const struct param_init ones = {PARAM_INIT_ONES, 0, 0};
	double out_std = 1.0 / sqrt((double)C);

	/* embedding N(0, 1); output trunc-normal std dim^-0.5 cut at 3 sigma */
	param_table_add(t, &cap, "tok_embeddings.weight", 0, Vs, C, true,
	                (struct param_init){PARAM_INIT_NORMAL, 1.0, 0});
	if (S > 1)
		table_split_last(t, 0, V, S, R);
	t->numel_embedding = Vs * C;
	for (int l = 0; l < L; l++) {
		t->unit_begin[l + 1] = t->numel;
		for (int k = 0; k < LB_COUNT; k++) {
			const struct block_tensor_spec *b = &block_spec[k];
			int64_t g0 = block_dim_size(c, b->rows), g1 = block_dim_size(c, b->cols);
			double std = b->depth_init ? 0.02 / sqrt(2.0 * (l + 1)) : 0.02;
			struct param_init init =
			    b->norm ? ones : (struct param_init){PARAM_INIT_TRUNC_NORMAL, std, 2.0};
			snprintf(name, sizeof(name), "layers.%d.%s", l, b->suffix);
			param_table_add(t, &cap, name, l + 1, b->tp == 0 ? g0 / S : g0,
			                b->tp == 1 ? g1 / S : g1, true, init);
			if (S > 1 && b->tp >= 0)
				table_split_last(t, b->tp, b->tp == 0 ? g0 : g1, S, R);
		}
	}
	t->unit_begin[L + 1] = t->numel;
	param_table_add(t, &cap, "norm.weight", L + 1, C, 0, true, ones);
	param_table_add(t, &cap, "output.weight", L + 1, Vs, C, true,
	                (struct param_init){PARAM_INIT_TRUNC_NORMAL, out_std, 3.0 * out_std});
	if (S > 1)
		table_split_last(t, 0, V, S, R);
	t->unit_begin[L + 2] = t->numel;
	return CT_OK;
}

double llama_flops_per_token(const struct llama_config *c, const struct param_table *t,
                             int64_t seq_len)
{
	/* with a tensor-parallel table: this rank's share (its heads and its weights) */
	int64_t S = t->tp_size > 1 ? t->tp_size : 1;
	return 6.0 * (double)(t->numel - t->numel_embedding) +
	       12.0 * (double)c->n_layers * (double)c->dim * (double)seq_len / (double)S;
}

/* ---------------------------------------------------------------- init */

static void init_params_tp(const struct llama_config *c, const struct param_table *t, uint64_t seed,
                           float *out, int64_t first, int64_t n)
{
	struct param_table g;
	llama_table_build(&g, c);
	int64_t last = first + n;
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i], *gp = &g.p[i];
		int64_t lo = p->offset > first ? p->offset : first;
		int64_t hi = p->offset + p->numel < last ? p->offset + p->numel : last;
		int64_t cols = p->shape[1], gcols = gp->shape[1];
		/* one row segment at a time: each maps to a contiguous global range */
		for (int64_t e = lo; e < hi;) {
			int64_t row = (e - p->offset) / cols, col = (e - p->offset) % cols;
			int64_t cnt = cols - col < hi - e ? cols - col : hi - e;
			float *dst = out + (e - first);
			if (p->tp_dim == 0 && row >= p->tp_valid) {
				memset(dst, 0, (size_t)cnt * sizeof(float));
			} else {
				int64_t grow = p->tp_dim == 0 ? p->tp_start + row : row;
				int64_t gcol = p->tp_dim == 1 ? p->tp_start + col : col;
				llama_init_params(c, &g, seed, dst,
				                  gp->offset + grow * gcols + gcol, cnt);
			}
			e += cnt;
		}
	}
	param_table_free(&g);
}

void llama_init_params(const struct llama_config *c, const struct param_table *t, uint64_t seed,
                       float *out, int64_t first, int64_t n)
{
	if (t->tp_size > 1)
		init_params_tp(c, t, seed, out, first, n);
	else
		param_table_init_range(t, seed, out, first, n); /* the table carries each init */
}

/* ---------------------------------------------------------------- build */

float *llama_tensor_at(const struct llama_model *m, float *const *unit_base, int i)
{
	const struct param_entry *p = &m->table.p[i];
	return unit_base[p->unit] + (p->offset - m->table.unit_begin[p->unit]);
}

struct llama_block_ptrs llama_block_ptrs_of(const struct llama_model *m, float *const *unit_base,
                                            int l)
{
	struct llama_block_ptrs b;
	float **dst[LB_COUNT] = {
	    [LB_ATTN_NORM] = &b.attn_norm,
	    [LB_WQ] = &b.wq,
	    [LB_WK] = &b.wk,
	    [LB_WV] = &b.wv,
	    [LB_WO] = &b.wo,
	    [LB_FFN_NORM] = &b.ffn_norm,
	    [LB_W1] = &b.w1,
	    [LB_W2] = &b.w2,
	    [LB_W3] = &b.w3,
	};
	for (int k = 0; k < LB_COUNT; k++)
		*dst[k] = llama_tensor_at(m, unit_base, llama_param_index(l, k));
	return b;
}

void llama_bind_unit(struct llama_model *m, int u, float *params, float *grads)
{
	m->unit_w[u] = params;
	m->unit_dw[u] = grads;
}

int64_t llama_ce_rows(int64_t V, int64_t N)
{
	int64_t rows = LLAMA_CE_LOGIT_BYTES / (4 * V);
	int64_t quarter = (N + 3) / 4;
	int64_t want = quarter > LLAMA_CE_MIN_ROWS ? quarter : LLAMA_CE_MIN_ROWS;
	rows = rows < want ? rows : want;
	return rows < 1 ? 1 : (rows > N ? N : rows);
}

/* Rotation angles t*f_i with Llama 3.1 frequency scaling as an option. */
void llama_rope_tables(const struct llama_config *c, int64_t T, float *cos_tab, float *sin_tab)
{
	int64_t half = c->head_dim / 2;
	for (int64_t i = 0; i < half; i++) {
		double freq = pow(c->rope_theta, -2.0 * (double)i / (double)c->head_dim);
		if (c->rope_scaling) {
			double old_ctx = (double)c->rope_original_ctx;
			double low_wavelen = old_ctx / c->rope_low_freq_factor;
			double high_wavelen = old_ctx / c->rope_high_freq_factor;
			double wavelen = 2.0 * M_PI / freq;
			if (wavelen < high_wavelen) {
				/* high frequency: unchanged */
			} else if (wavelen > low_wavelen) {
				freq /= c->rope_factor;
			} else {
				double smooth =
				    (old_ctx / wavelen - c->rope_low_freq_factor) /
				    (c->rope_high_freq_factor - c->rope_low_freq_factor);
				freq = (1.0 - smooth) * freq / c->rope_factor + smooth * freq;
			}
		}
		for (int64_t t = 0; t < T; t++) {
			double ang = (double)t * freq;
			cos_tab[t * half + i] = (float)cos(ang);
			sin_tab[t * half + i] = (float)sin(ang);
		}
	}
}

/* All activation and scratch buffers come from two allocations carved into views. */
struct carver {
	char *base;
	int64_t off;
};

static void *carve(struct carver *cv, int64_t bytes)
{
	int64_t at = cv->off;
	cv->off += (bytes + 63) & ~(int64_t)63;
	return cv->base ? cv->base + at : NULL;
}

struct llama_dims llama_dims_of(const struct llama_model *m)
{
	const struct llama_config *c = &m->cfg;
	int64_t S = m->tp ? m->tp->size : 1;
	struct llama_dims d = {.B = m->B,
	                       .T = m->T,
	                       .N = m->N,
	                       .Ns = m->Ns,
	                       .C = c->dim,
	                       .D = c->head_dim,
	                       .H = c->n_heads / S,
	                       .KV = c->n_kv_heads / S,
	                       .F = c->ffn_hidden / S,
	                       .V = (c->vocab_size + S - 1) / S};
	d.HD = d.H * d.D;
	d.KVD = d.KV * d.D;
	return d;
}

/* What each activation-checkpointing mode keeps per block (K) and what is re-derived (-):
 *
 *              x  rstd1  q  k  v  att  lse  xmid  rstd2  h1  h3   re-derived by
 *   NONE       K    K    K  K  K   K    K    K     K     K   K    -
 *   FFN        K    K    K  K  K   K    K    K     K     -   -    the backward (h1s, h3s)
 *   SELECTIVE  K    -    K  -  K   K    K    -     -     K   -    the selective recompute
 *   FULL       K    -    -  -  -   -    -    -     -     -   -    the forward again
 *
 * The input x is always kept. What a mode re-derives lives once, in buffers shared by every
 * block (FFN's h1/h3 in the backward scratch h1s/h3s instead). SELECTIVE is TorchTitan's
 * per-op policy: keep matmul and attention outputs except every second matmul (wk, wo, w3),
 * and recompute the norms. The block's three walkers in llama_block.c (forward, selective
 * recompute, backward) read and write exactly these buffers; block_keeps below is the table
 * in code. */
enum block_act {
	BA_RSTD1,
	BA_Q,
	BA_K,
	BA_V,
	BA_ATT,
	BA_LSE,
	BA_XMID,
	BA_RSTD2,
	BA_H1,
	BA_H3,
	BA_COUNT
};
#define KEEP(a) (1u << (a))
static const unsigned block_keeps[MODEL_AC_COUNT] = {
    [MODEL_AC_NONE] = (1u << BA_COUNT) - 1,
    [MODEL_AC_FFN] = ((1u << BA_COUNT) - 1) & ~(KEEP(BA_H1) | KEEP(BA_H3)),
    [MODEL_AC_SELECTIVE] = KEEP(BA_Q) | KEEP(BA_V) | KEEP(BA_ATT) | KEEP(BA_LSE) | KEEP(BA_H1),
    [MODEL_AC_FULL] = 0,
};

static float **block_act_slot(struct llama_block_acts *a, enum block_act k)
{
	float **slot[BA_COUNT] = {
	    [BA_RSTD1] = &a->rstd1, [BA_Q] = &a->q,         [BA_K] = &a->k,
	    [BA_V] = &a->v,         [BA_ATT] = &a->att,     [BA_LSE] = &a->lse,
	    [BA_XMID] = &a->xmid,   [BA_RSTD2] = &a->rstd2, [BA_H1] = &a->h1,
	    [BA_H3] = &a->h3,
	};
	return slot[k];
}

static void plan_acts(struct llama_model *m, struct carver *cv)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_dims d = llama_dims_of(m);
	int64_t N = m->N, Nr = d.Ns, C = c->dim, f = sizeof(float);
	const int64_t bytes[BA_COUNT] = {
	    [BA_RSTD1] = Nr * f,    [BA_Q] = N * d.HD * f,   [BA_K] = N * d.KVD * f,
	    [BA_V] = N * d.KVD * f, [BA_ATT] = N * d.HD * f, [BA_LSE] = N * d.H * f,
	    [BA_XMID] = Nr * C * f, [BA_RSTD2] = Nr * f,     [BA_H1] = N * d.F * f,
	    [BA_H3] = N * d.F * f,
	};
	int L = (int)c->n_layers, lo = m->unit_lo, hi = m->unit_hi;
	bool head = hi == L + 2; /* the final norm + output + loss unit is planned */
	m->tokens = carve(cv, N * (int64_t)sizeof(int32_t));
	m->targets = carve(cv, N * (int64_t)sizeof(int32_t));
	/* what some block of the range drops and re-derives: one shared set (FFN recomputes
	 * into backward scratch instead) */
	unsigned dropped = 0;
	for (int l = lo - 1; l < hi - 1; l++)
		if (l >= 0 && l < L && llama_block_ac(m, l) != MODEL_AC_FFN)
			dropped |= ~block_keeps[llama_block_ac(m, l)] & ((1u << BA_COUNT) - 1);
	struct llama_block_acts shared = {0};
	for (int k = 0; k < BA_COUNT; k++)
		if (dropped & KEEP(k))
			*block_act_slot(&shared, (enum block_act)k) = carve(cv, bytes[k]);
	for (int l = 0; l < L; l++) {
		struct llama_block_acts *a = &m->acts[l];
		memset(a, 0, sizeof(*a));
		if (l + 1 == hi) /* the range's output: the input of the next block */
			a->x = carve(cv, Nr * C * f);
		if (l + 1 < lo || l + 1 >= hi) /* block l is unit l + 1 */
			continue;
		*a = shared;
		a->x = carve(cv, Nr * C * f);
		unsigned keeps = block_keeps[llama_block_ac(m, l)];
		for (int k = 0; k < BA_COUNT; k++)
			if (keeps & KEEP(k))
				*block_act_slot(a, (enum block_act)k) = carve(cv, bytes[k]);
	}
	m->x_final = hi > L ? carve(cv, Nr * C * f) : NULL;
	m->rstd_f = head ? carve(cv, Nr * f) : NULL;
	m->xn_final = head ? carve(cv, m->Np * C * f) : NULL; /* TP: gathered */
	m->rope_cos = carve(cv, m->T * (c->head_dim / 2) * f);
	m->rope_sin = carve(cv, m->T * (c->head_dim / 2) * f);
}
#undef KEEP

static void plan_scratch(struct llama_model *m, struct carver *cv)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_dims d = llama_dims_of(m);
	int64_t N = m->N, Nr = d.Ns, C = c->dim, HD = d.HD;
	int64_t KVD = d.KVD, F = d.F;
	int64_t f = sizeof(float);
	m->dres = carve(cv, Nr * C * f);
	m->xn = carve(cv, Nr * C * f);
	m->dxn = carve(cv, Nr * C * f);
	m->gate = carve(cv, N * F * f);
	m->dh1 = carve(cv, N * F * f);
	m->dh3 = carve(cv, N * F * f);
	if (m->recompute_ffn) {
		m->h1s = carve(cv, N * F * f);
		m->h3s = carve(cv, N * F * f);
	}
	m->dq = carve(cv, N * HD * f);
	m->dk = carve(cv, N * KVD * f);
	m->dv = carve(cv, N * KVD * f);
	m->datt = carve(cv, N * HD * f);
	m->ce_scratch = m->unit_hi == c->n_layers + 2 ? carve(cv, m->ce_rows * d.V * f) : NULL;
}

/* What a split backward keeps per unit (struct llama_wkeep): the gathered activations and
 * gradients of all N tokens, this rank's heads and FFN features. */
static int64_t wkeep_floats(const struct llama_model *m)
{
	const struct llama_dims d = llama_dims_of(m);
	return d.N * (4 * d.C + 3 * d.F + 2 * d.HD + 2 * d.KVD);
}

struct llama_wkeep llama_wkeep_at(const struct llama_model *m, int u)
{
	struct llama_wkeep k = {0};
	if (!m->wkeep || u < m->unit_lo || u >= m->unit_hi || u > m->cfg.n_layers)
		return k;
	const struct llama_dims d = llama_dims_of(m);
	int64_t N = d.N, C = d.C, F = d.F, HD = d.HD, KVD = d.KVD;
	float *p = m->wkeep + (int64_t)(u - m->unit_lo) * wkeep_floats(m);
	float **slot[] = {&k.dout2, &k.gate, &k.dh1, &k.dh3, &k.xn2, &k.dout1,
	                  &k.att,   &k.dq,   &k.dk,  &k.dv,  &k.xn1};
	const int64_t n[] = {N * C,  N * F,  N * F,   N * F,   N * C, N * C,
	                     N * HD, N * HD, N * KVD, N * KVD, N * C};
	for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++) {
		*slot[i] = p;
		p += n[i];
	}
	return k;
}

int llama_build_ex(struct llama_model *m, const struct llama_config *c, int64_t B, int64_t T,
                   const struct llama_build_opts *opts)
{
	memset(m, 0, sizeof(*m));
	m->cfg = *c;
	m->ac = opts->recompute_ffn ? MODEL_AC_FFN : opts->ac;
	m->ac_every = m->ac == MODEL_AC_LAYER ? opts->ac_every : 0;
	CHECK(m->ac != MODEL_AC_LAYER || m->ac_every > 0, "llama: per-layer checkpointing needs N");
	m->recompute_ffn = m->ac == MODEL_AC_FFN;
	int rc = llama_config_finish(&m->cfg);
	if (rc)
		return rc;
	m->tp = opts->tp && opts->tp->size > 1 ? opts->tp : NULL;
	rc = llama_table_build_tp(&m->table, &m->cfg, m->tp ? m->tp->size : 1,
	                          m->tp ? m->tp->rank : 0);
	if (rc)
		return rc;
	m->B = B;
	m->T = T;
	m->N = B * T;
	int S = m->tp ? m->tp->size : 1; /* one rank: the group of one */
	m->Ns = (m->N + S - 1) / S;
	m->Np = m->Ns * S;
	int L = (int)c->n_layers;
	m->unit_lo = opts->unit_hi > 0 ? opts->unit_lo : 0;
	m->unit_hi = opts->unit_hi > 0 ? opts->unit_hi : L + 2;
	if (m->unit_lo < 0 || m->unit_hi > L + 2 || m->unit_lo >= m->unit_hi) {
		LOG_ERROR("llama: unit range [%d, %d) outside the model's %d units", m->unit_lo,
		          m->unit_hi, L + 2);
		return CT_ERR_USAGE;
	}
	m->ce_rows = llama_ce_rows(llama_dims_of(m).V, m->N);

	m->unit_w = xcalloc((size_t)m->table.n_units, sizeof(float *));
	m->unit_dw = xcalloc((size_t)m->table.n_units, sizeof(float *));
	if (opts->own_params) {
		size_t pbytes = (size_t)m->table.numel * sizeof(float);
		m->params = mem_alloc(MEM_PARAMS, pbytes);
		m->grads = mem_alloc(MEM_GRADS, pbytes);
		for (int u = 0; u < m->table.n_units; u++)
			llama_bind_unit(m, u, m->params + m->table.unit_begin[u],
			                m->grads + m->table.unit_begin[u]);
	}

	m->acts = xcalloc((size_t)L, sizeof(*m->acts));
	struct carver cv = {0};
	plan_acts(m, &cv);
	m->act_bytes = cv.off;
	cv = (struct carver){mem_alloc(MEM_ACTIVATIONS, (size_t)m->act_bytes), 0};
	plan_acts(m, &cv);
	struct carver sv = {0};
	plan_scratch(m, &sv);
	m->scratch_bytes = sv.off;
	sv = (struct carver){mem_alloc(MEM_ACTIVATIONS, (size_t)m->scratch_bytes), 0};
	plan_scratch(m, &sv);
	llama_rope_tables(&m->cfg, T, m->rope_cos, m->rope_sin);
	if (m->tp)
		llama_tp_build(m, opts);
	if (opts->cp && opts->cp->size > 1) {
		rc = llama_cp_build(m, opts);
		if (rc)
			return rc;
	}
	if (opts->split_backward) {
		/* under TP the kept buffers are the gathered ones (llama_wkeep); async TP's
		 * ring-decomposed backward computes each weight gradient block by block inside
		 * the input-gradient ring, so it has no W half to defer */
		if (m->tp && opts->tp_async) {
			LOG_ERROR("llama: a split backward (zero-bubble pipeline schedules) with async "
			          "TP: not supported (the ring steps compute the weight gradients "
			          "inside the input-gradient matmuls, so there is no separate "
			          "weight-gradient pass to defer)");
			return CT_ERR_USAGE;
		}
		int n = (m->unit_hi < L + 1 ? m->unit_hi : L + 1) - m->unit_lo; /* not the head */
		m->wkeep_bytes =
		    (int64_t)(n > 0 ? n : 0) * wkeep_floats(m) * (int64_t)sizeof(float);
		m->wkeep =
		    m->wkeep_bytes ? mem_alloc(MEM_ACTIVATIONS, (size_t)m->wkeep_bytes) : NULL;
	}
	return CT_OK;
}

void llama_free(struct llama_model *m)
{
	if (!m->unit_w)
		return;
	size_t pbytes = (size_t)m->table.numel * sizeof(float);
	mem_free(MEM_PARAMS, m->params, pbytes);
	mem_free(MEM_GRADS, m->grads, pbytes);
	mem_free(MEM_ACTIVATIONS, m->tokens, (size_t)m->act_bytes); /* first carved view */
	mem_free(MEM_ACTIVATIONS, m->dres, (size_t)m->scratch_bytes);
	if (m->tp)
		llama_tp_free(m);
	llama_cp_free(m);
	if (m->wkeep)
		mem_free(MEM_ACTIVATIONS, m->wkeep, (size_t)m->wkeep_bytes);
	free(m->unit_w);
	free(m->unit_dw);
	free(m->acts);
	param_table_free(&m->table);
	memset(m, 0, sizeof(*m));
}

int64_t llama_count_valid(const int32_t *targets, int64_t n)
{
	int64_t v = 0;
	for (int64_t i = 0; i < n; i++)
		v += targets[i] != LLAMA_IGNORE_INDEX;
	return v;
}

/* ---------------------------------------------------------------- units
 *
 * Every pass of a unit is its program (llama_impl.h). Under tensor parallelism the schedule
 * runs it op by op (llama_unit_op); one rank runs all of its segments in order as one pass,
 * and has no collectives to run between them. */

float *llama_block_output(struct llama_model *m, int l)
{
	return l + 1 < m->cfg.n_layers ? m->acts[l + 1].x : m->x_final;
}

/* a pass that does nothing: the recompute of a unit that never recomputes */
static const struct llama_op no_pass[] = {LLAMA_SEG(NULL)};

struct llama_prog llama_prog_of(int L, bool async, enum model_ac ac, int u, enum model_pass p)
{
	if (p == MODEL_PASS_REC &&
	    !(u >= 1 && u <= L && (ac == MODEL_AC_SELECTIVE || ac == MODEL_AC_FULL)))
		return LLAMA_PROG(no_pass);
	if (u == 0)
		return llama_embed_prog(p);
	if (u > L)
		return llama_head_prog(p);
	return llama_block_prog(async, ac, p);
}

enum model_ac llama_unit_ac(const struct llama_model *m, int u)
{
	return u >= 1 && u <= m->cfg.n_layers ? llama_block_ac(m, u - 1) : m->ac;
}

struct llama_layout llama_layout_of(const struct llama_model *m)
{
	return (struct llama_layout){.tp = m->tp != NULL,
	                             .async = m->tp && m->tpb->async,
	                             .cp = m->cp != NULL,
	                             .ring = llama_cp_ring_form(m)};
}

bool llama_op_in(const struct llama_op *o, struct llama_layout lay)
{
	switch (o->cp) {
	case LLAMA_CP_ALLGATHER:
		if (!lay.cp || lay.ring)
			return false;
		break;
	case LLAMA_CP_RING:
		if (!lay.cp || !lay.ring)
			return false;
		break;
	case LLAMA_CP_NOT_RING:
		if (lay.cp && lay.ring)
			return false;
		break;
	default:
		break;
	}
	if (!o->coll)
		return true;
	return o->role == MODEL_GROUP_CP ? lay.cp : lay.tp;
}

void llama_prog_eff(struct llama_prog g, struct llama_layout lay, struct llama_eff *e)
{
	int lo = 0;
	e->n_ops = 0;
	for (int i = 0; i < g.n_ops; i++) {
		if (!g.ops[i].coll || !llama_op_in(&g.ops[i], lay))
			continue;
		CHECK(e->n_ops + 2 < 2 * MODEL_PROG_MAX + 1,
		      "llama: a pass of too many collectives");
		e->op[e->n_ops].lo = lo, e->op[e->n_ops++].hi = i;
		e->op[e->n_ops].lo = i, e->op[e->n_ops++].hi = i + 1;
		lo = i + 1;
	}
	e->op[e->n_ops].lo = lo, e->op[e->n_ops++].hi = g.n_ops;
}

static struct llama_prog model_prog_of(const struct llama_model *m, int u, enum model_pass p)
{
	return llama_prog_of((int)m->cfg.n_layers, m->tp && m->tpb->async, llama_unit_ac(m, u), u,
	                     p);
}

static void model_eff_of(const struct llama_model *m, int u, enum model_pass p, struct llama_eff *e)
{
	llama_prog_eff(model_prog_of(m, u, p), llama_layout_of(m), e);
}

/* Ops [lo, hi) of unit u's pass p: the segments, and under TP or CP the collectives (*ran:
 * whether the last one ran). Returns the loss sum when they end the head's forward (else 0). */
static double run_ops(struct llama_model *m, int u, enum model_pass p, int lo, int hi,
                      double dscale, int64_t *n_valid, bool *ran)
{
	struct llama_prog g = model_prog_of(m, u, p);
	const struct llama_layout lay = llama_layout_of(m);
	struct llama_eff e;
	llama_prog_eff(g, lay, &e);
	bool r = false;
	m->pass_dscale = dscale;
	for (int op = lo; op < hi; op++) {
		if (op % 2) {
			r = g.ops[e.op[op].lo].coll(m, u - 1);
			continue;
		}
		for (int i = e.op[op].lo; i < e.op[op].hi; i++)
			if (g.ops[i].seg && llama_op_in(&g.ops[i], lay))
				g.ops[i].seg(m, u - 1);
	}
	if (ran)
		*ran = r;
	if (n_valid)
		*n_valid = 0;
	if (p != MODEL_PASS_FWD || u <= m->cfg.n_layers || hi != e.n_ops)
		return 0.0;
	if (n_valid) /* the head's forward is done: its loss (h_loss left it here) */
		*n_valid = m->pass_valid;
	return m->pass_loss;
}

static double run_pass(struct llama_model *m, int u, enum model_pass p, double dscale,
                       int64_t *n_valid)
{
	struct llama_eff e;
	model_eff_of(m, u, p, &e);
	return run_ops(m, u, p, 0, e.n_ops, dscale, n_valid, NULL);
}

double llama_unit_forward(struct llama_model *m, int u, int64_t *n_valid)
{
	return run_pass(m, u, MODEL_PASS_FWD, 0.0, n_valid);
}

/* Every unit's forward is a pure function of its saved input and its parameters (and the
 * collectives are deterministic), so recomputing is running it again: all of it, or under
 * SELECTIVE a block's dropped activations. */
void llama_unit_recompute(struct llama_model *m, int u)
{
	run_pass(m, u, MODEL_PASS_REC, 0.0, NULL);
}

void llama_unit_backward(struct llama_model *m, int u, double dscale)
{
	run_pass(m, u, MODEL_PASS_BWD, dscale, NULL);
}

void llama_unit_backward_weight(struct llama_model *m, int u)
{
	const struct llama_wkeep k = llama_wkeep_at(m, u);
	CHECK(k.dout2, "llama: unit %d has no split backward to finish", u);
	if (u >= 1)
		llama_block_backward_weight(m, u - 1, &k);
	else
		llama_embed_backward_weight(m, &k);
}

bool llama_unit_needs_recompute(const struct llama_model *m, int u)
{
	return u > 0 && u <= m->cfg.n_layers && model_ac_block_recomputes(m->ac, m->ac_every, u - 1);
}

void llama_unit_prog(const struct llama_model *m, int u, enum model_pass p, struct model_prog *out)
{
	memset(out, 0, sizeof(*out)); /* one rank: one segment */
	if (!m->tp && !m->cp)
		return;
	const int64_t cp = m->cp ? m->cp->size : 1;
	const struct llama_layout lay = llama_layout_of(m);
	const struct llama_prog_shape s = {.B = m->B,
	                                   .T = m->T * cp,
	                                   .tp = m->tp ? m->tp->size : 1,
	                                   .cp = cp,
	                                   .elem_bytes = sizeof(float),
	                                   .async = lay.async,
	                                   .cp_ring = lay.ring,
	                                   .cp_headtail = llama_cp_headtail(m)};
	llama_prog_descs_of(&m->cfg, &s, llama_unit_ac(m, u), u, p, out);
}

double llama_unit_op(struct llama_model *m, int u, enum model_pass p, int op, double dscale,
                     int64_t *n_valid, bool *ran)
{
	struct llama_eff e;
	model_eff_of(m, u, p, &e);
	if (e.n_ops == 1) {
		CHECK(op == 0, "llama unit %d: op %d of a one-segment pass", u, op);
		return run_ops(m, u, p, 0, 1, dscale, n_valid, ran);
	}
	CHECK(op >= 0 && op < e.n_ops, "llama unit %d: op %d of %d", u, op, e.n_ops);
	return run_ops(m, u, p, op, op + 1, dscale, n_valid, ran);
}

/* ---------------------------------------------------------------- the whole model */

double llama_forward(struct llama_model *m, int64_t *n_valid)
{
	double loss = 0.0;
	for (int u = 0; u < m->table.n_units; u++)
		loss += llama_unit_forward(m, u, n_valid);
	return loss;
}

void llama_backward(struct llama_model *m, double dscale)
{
	for (int u = m->table.n_units - 1; u >= 0; u--) {
		if (llama_unit_needs_recompute(m, u))
			llama_unit_recompute(m, u);
		llama_unit_backward(m, u, dscale);
	}
}
