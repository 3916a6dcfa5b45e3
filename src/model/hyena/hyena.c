/* Hyena: presets, parameter table, init, build, and the units (compute in hyena_impl.h,
 * instantiated for float and double below). */
#include "model/hyena/hyena.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "kernels/hyena_kernels.h"
#include "kernels/kernels.h"

/* ---------------------------------------------------------------- configs */

struct hyena_preset {
	const char *name;
	int64_t vocab, dim, n_layers, order, filter_order, emb_dim, ffn_hidden;
	double sin_freq;
};

/* hyena-debug: a tiny model for tests. hyena-small: the CPU training config (safari's Pile
 * settings for the filter: emb_dim 33, w 14, filter_order 64; d_inner 4D). */
static const struct hyena_preset hyena_presets[] = {
    {"hyena-debug", 2048, 64, 2, 2, 32, 5, 256, 1.0},
    {"hyena-small", 2048, 128, 4, 2, 64, 33, 512, 14.0},
};

const char *hyena_flavor_name(int i)
{
	return i >= 0 && i < (int)(sizeof(hyena_presets) / sizeof(hyena_presets[0]))
	           ? hyena_presets[i].name
	           : NULL;
}

const char *hyena_flavor_list(void)
{
	return "hyena-debug, hyena-small";
}

bool hyena_is_flavor(const char *flavor)
{
	for (size_t i = 0; i < sizeof(hyena_presets) / sizeof(hyena_presets[0]); i++)
		if (strcmp(hyena_presets[i].name, flavor) == 0)
			return true;
	return false;
}

int hyena_config_finish(struct hyena_config *c)
{
	if (c->dim <= 0 || c->n_layers <= 0 || c->vocab_size <= 1 || c->filter_order <= 0 ||
	    c->ffn_hidden <= 0 || c->l_max <= 0) {
		LOG_ERROR("model: hyena dimensions must be positive (dim %lld, layers %lld, vocab "
		          "%lld, filter_order %lld, ffn %lld, l_max %lld)",
		          (long long)c->dim, (long long)c->n_layers, (long long)c->vocab_size,
		          (long long)c->filter_order, (long long)c->ffn_hidden,
		          (long long)c->l_max);
		return CT_ERR_USAGE;
	}
	if (c->order < 2) {
		LOG_ERROR("model.hyena_order: %lld, must be >= 2", (long long)c->order);
		return CT_ERR_USAGE;
	}
	if (c->emb_dim < 3 || c->emb_dim % 2 == 0) {
		LOG_ERROR("model.hyena_emb_dim: %lld, must be odd and >= 3", (long long)c->emb_dim);
		return CT_ERR_USAGE;
	}
	if (!(c->sin_freq > 0) || !(c->norm_eps > 0)) {
		LOG_ERROR("model.hyena_sin_freq: %g, must be > 0", c->sin_freq);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

int hyena_config_preset(struct hyena_config *c, const char *flavor)
{
	for (size_t i = 0; i < sizeof(hyena_presets) / sizeof(hyena_presets[0]); i++) {
		const struct hyena_preset *p = &hyena_presets[i];
		if (strcmp(p->name, flavor) != 0)
			continue;
		memset(c, 0, sizeof(*c));
		snprintf(c->flavor, sizeof(c->flavor), "%s", p->name);
		c->vocab_size = p->vocab;
		c->dim = p->dim;
		c->n_layers = p->n_layers;
		c->order = p->order;
		c->filter_order = p->filter_order;
		c->emb_dim = p->emb_dim;
		c->ffn_hidden = p->ffn_hidden;
		c->sin_freq = p->sin_freq;
		c->norm_eps = 1e-5;
		c->l_max = 0;
		return CT_OK;
	}
	LOG_ERROR("model.flavor: unknown hyena flavor '%s' (choose from %s)", flavor,
	          hyena_flavor_list());
	return CT_ERR_USAGE;
}

/* ---------------------------------------------------------------- parameter table */

/* Whether block tensor k is one of the linears a float8 converter swaps. */
static bool hyena_fp8_linear(int k)
{
	return k == HYB_IN_W || k == HYB_OUT_W || k == HYB_FC1_W || k == HYB_FC2_W;
}

/* safari's names of a block's groups (a group of several tensors: its tensors' names put the
 * stream or order before the last part, e.g. mixer.in_proj.<s>.weight) */
static const char *const hyena_names[HYB_COUNT] = {
    [HYB_NORM1_W] = "mixer_norm.weight",
    [HYB_NORM1_B] = "mixer_norm.bias",
    [HYB_IN_W] = "mixer.in_proj.weight",
    [HYB_IN_B] = "mixer.in_proj.bias",
    [HYB_SF_W] = "mixer.short_filter.weight",
    [HYB_SF_B] = "mixer.short_filter.bias",
    [HYB_FBIAS] = "mixer.filter_fn.bias",
    [HYB_MLP0_W] = "mixer.filter_fn.implicit_filter.0.weight",
    [HYB_MLP0_B] = "mixer.filter_fn.implicit_filter.0.bias",
    [HYB_FREQ] = "mixer.filter_fn.implicit_filter.1.freq",
    [HYB_MLP1_W] = "mixer.filter_fn.implicit_filter.2.weight",
    [HYB_MLP1_B] = "mixer.filter_fn.implicit_filter.2.bias",
    [HYB_MLP2_W] = "mixer.filter_fn.implicit_filter.4.weight",
    [HYB_MLP2_B] = "mixer.filter_fn.implicit_filter.4.bias",
    [HYB_MLP3_W] = "mixer.filter_fn.implicit_filter.6.weight",
    [HYB_OUT_W] = "mixer.out_proj.weight",
    [HYB_OUT_B] = "mixer.out_proj.bias",
    [HYB_NORM2_W] = "ffn_norm.weight",
    [HYB_NORM2_B] = "ffn_norm.bias",
    [HYB_FC1_W] = "feed_forward.fc1.weight",
    [HYB_FC1_B] = "feed_forward.fc1.bias",
    [HYB_FC2_W] = "feed_forward.fc2.weight",
    [HYB_FC2_B] = "feed_forward.fc2.bias",
};

/* How a block tensor splits under tensor parallelism: -1 replicated, 0 rows (every stream
 * or order tensor, fc1), 1 columns (out_proj, fc2). */
static int hyena_tp_dim(int k)
{
	switch (k) {
	case HYB_IN_W:
	case HYB_IN_B:
	case HYB_SF_W:
	case HYB_SF_B:
	case HYB_FBIAS:
	case HYB_MLP3_W:
	case HYB_FC1_W:
	case HYB_FC1_B:
		return 0;
	case HYB_OUT_W:
	case HYB_FC2_W:
		return 1;
	default:
		return -1;
	}
}

/* name of piece s of group `base` (layers.<l>.<stem>.<s>.<last>) */
static void piece_name(char *out, size_t n, int l, const char *base, int s)
{
	const char *dot = strrchr(base, '.');
	snprintf(out, n, "layers.%d.%.*s.%d%s", l, (int)(dot - base), base, s, dot);
}

int hyena_tp_check(const struct hyena_config *c, int64_t tp)
{
	if (tp > 1 && (c->dim % tp || c->ffn_hidden % tp)) {
		LOG_ERROR("parallelism.tensor_parallel_degree = %lld must divide the model's dim "
		          "(%lld) and ffn_hidden (%lld) (model.flavor = %s)",
		          (long long)tp, (long long)c->dim, (long long)c->ffn_hidden, c->flavor);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

int hyena_table_build(struct param_table *t, const struct hyena_config *c)
{
	return hyena_table_build_tp(t, c, 1, 0);
}

int hyena_table_build_tp(struct param_table *t, const struct hyena_config *c, int tp, int tp_rank)
{
	memset(t, 0, sizeof(*t));
	if (hyena_tp_check(c, tp))
		return CT_ERR_USAGE;
	int S = tp > 1 ? tp : 1;
	t->tp_size = S;
	t->tp_rank = S > 1 ? tp_rank : 0;
	int cap = 0, L = (int)c->n_layers;
	int64_t D = c->dim, F = c->filter_order;
	int64_t E = c->emb_dim, H = c->ffn_hidden, V = c->vocab_size;
	t->n_units = L + 2;
	t->unit_begin = xcalloc((size_t)t->n_units + 1, sizeof(int64_t));
	char name[PARAM_NAME_MAX];
	/* safari's init: Linear weights N(0, 0.02), the output projections (out_proj, fc2)
	 * depth-scaled by 1/sqrt(2L); biases 0; LayerNorms 1 and 0; the implicit filter's Linear
	 * layers torch's default U(+-1/sqrt(fan_in)) (biases too), its sine frequency constant;
	 * the short filter Conv1d's default with fan_in = 3 (one input channel per group); the
	 * filter bias N(0, 1). */
	const struct param_init zeros = {PARAM_INIT_ZEROS, 0, 0}, ones = {PARAM_INIT_ONES, 0, 0};
	const struct param_init lin = {PARAM_INIT_NORMAL, 0.02, 0};
	const struct param_init lin_depth = {PARAM_INIT_NORMAL, 0.02 / sqrt(2.0 * (double)L), 0};
	const struct param_init filt_e = {PARAM_INIT_UNIFORM, 1.0 / sqrt((double)E), 0};
	const struct param_init filt_f = {PARAM_INIT_UNIFORM, 1.0 / sqrt((double)F), 0};
	const struct param_init init[HYB_COUNT] = {
	    [HYB_NORM1_W] = ones,
	    [HYB_NORM1_B] = zeros,
	    [HYB_IN_W] = lin,
	    [HYB_IN_B] = zeros,
	    [HYB_SF_W] = {PARAM_INIT_UNIFORM, 1.0 / sqrt((double)HYENA_SHORT_FILTER), 0},
	    [HYB_SF_B] = {PARAM_INIT_UNIFORM, 1.0 / sqrt((double)HYENA_SHORT_FILTER), 0},
	    [HYB_FBIAS] = {PARAM_INIT_NORMAL, 1.0, 0},
	    [HYB_MLP0_W] = filt_e,
	    [HYB_MLP0_B] = filt_e,
	    [HYB_FREQ] = {PARAM_INIT_CONST, c->sin_freq, 0},
	    [HYB_MLP1_W] = filt_f,
	    [HYB_MLP1_B] = filt_f,
	    [HYB_MLP2_W] = filt_f,
	    [HYB_MLP2_B] = filt_f,
	    [HYB_MLP3_W] = filt_f,
	    [HYB_OUT_W] = lin_depth,
	    [HYB_OUT_B] = zeros,
	    [HYB_NORM2_W] = ones,
	    [HYB_NORM2_B] = zeros,
	    [HYB_FC1_W] = lin,
	    [HYB_FC1_B] = zeros,
	    [HYB_FC2_W] = lin_depth,
	    [HYB_FC2_B] = zeros,
	};
	param_table_add(t, &cap, "tok_embeddings.weight", 0, V, D, true, lin);
	t->numel_embedding = V * D;
	/* the global shape of one tensor of each group */
	const int64_t shape[HYB_COUNT][2] = {
	    [HYB_NORM1_W] = {D, 0},
	    [HYB_NORM1_B] = {D, 0},
	    [HYB_IN_W] = {D, D},
	    [HYB_IN_B] = {D, 0},
	    [HYB_SF_W] = {D, HYENA_SHORT_FILTER},
	    [HYB_SF_B] = {D, 0},
	    [HYB_FBIAS] = {D, 0},
	    [HYB_MLP0_W] = {F, E},
	    [HYB_MLP0_B] = {F, 0},
	    [HYB_FREQ] = {F, 0},
	    [HYB_MLP1_W] = {F, F},
	    [HYB_MLP1_B] = {F, 0},
	    [HYB_MLP2_W] = {F, F},
	    [HYB_MLP2_B] = {F, 0},
	    [HYB_MLP3_W] = {D, F},
	    [HYB_OUT_W] = {D, D},
	    [HYB_OUT_B] = {D, 0},
	    [HYB_NORM2_W] = {D, 0},
	    [HYB_NORM2_B] = {D, 0},
	    [HYB_FC1_W] = {H, D},
	    [HYB_FC1_B] = {H, 0},
	    [HYB_FC2_W] = {D, H},
	    [HYB_FC2_B] = {D, 0},
	};
	for (int l = 0; l < L; l++) {
		t->unit_begin[l + 1] = t->numel;
		for (int k = 0; k < HYB_COUNT; k++) {
			int n = hyena_group_size(c, k), dim = S > 1 ? hyena_tp_dim(k) : -1;
			int64_t g0 = shape[k][0], g1 = shape[k][1];
			for (int s = 0; s < n; s++) {
				if (n > 1)
					piece_name(name, sizeof(name), l, hyena_names[k], s);
				else
					snprintf(name, sizeof(name), "layers.%d.%s", l, hyena_names[k]);
				/* safari: no weight decay on the implicit filter (its "_optim" wd =
				 * 0) */
				bool decay = strstr(hyena_names[k], "implicit_filter") == NULL;
				param_table_add(t, &cap, name, l + 1, dim == 0 ? g0 / S : g0,
				                dim == 1 ? g1 / S : g1, decay, init[k]);
				struct param_entry *e = &t->p[t->count - 1];
				/* float8 (TorchTitan converts every nn.Linear not in filter_fqns):
				 * in_proj, out_proj, fc1, fc2 convert; the short filter (a Conv1d)
				 * and the implicit filter MLP's tiny linears (filter_order wide, once
				 * per sequence) stay high precision, as the tied head does (it reads
				 * the embedding). in_proj's stream tensors are one linear, (P, D):
				 * the family registers the group itself (hyena_family.c), so none of
				 * them is a float8 linear of the table's (their all-gather stays in
				 * high precision, the linear casts the group with one scale) */
				e->high_precision = !hyena_fp8_linear(k) || k == HYB_IN_W;
				if (dim >= 0) {
					int64_t gl = dim == 0 ? g0 : g1, piece = gl / S;
					e->tp_dim = dim;
					e->tp_start = (int64_t)t->tp_rank * piece;
					e->tp_valid = piece;
					e->global_shape[dim] = gl;
				}
			}
		}
	}
	t->unit_begin[L + 1] = t->numel;
	param_table_add(t, &cap, "norm.weight", L + 1, D, 0, false, ones);
	param_table_add(t, &cap, "norm.bias", L + 1, D, 0, false, zeros);
	t->unit_begin[L + 2] = t->numel;
	return CT_OK;
}

double hyena_flops_per_token(const struct hyena_config *c, int64_t seq_len)
{
	double D = (double)c->dim, P = (double)((c->order + 1) * c->dim), H = (double)c->ffn_hidden;
	double F = (double)c->filter_order, E = (double)c->emb_dim, T = (double)seq_len;
	double Cf = (double)((c->order - 1) * c->dim), L = (double)c->n_layers;
	double matmul = L * (P * D + D * D + 2 * H * D) + (double)c->vocab_size * D;
	double n = (double)fftconv_size(seq_len);
	double conv = L * Cf * 6.0 * 2.5 * n * log2(n > 1 ? n : 2) / T;
	double filter = L * 6.0 * (E * F + 2 * F * F + F * Cf); /* per position, once per seq */
	return 6.0 * matmul + conv + filter;
}

/* ---------------------------------------------------------------- init */

/* Table entry i of a table of c: block *l, group *k, its tensor *s in the group (false: not
 * a block tensor: the embedding or the final norm). */
static bool locate(const struct hyena_config *c, int i, int *l, int *k, int *s)
{
	int per = hyena_block_tensors(c);
	if (i < 1 || i >= 1 + (int)c->n_layers * per)
		return false;
	*l = (i - 1) / per;
	int j = (i - 1) % per;
	for (*k = 0; j >= hyena_group_size(c, *k); (*k)++)
		j -= hyena_group_size(c, *k);
	*s = j;
	return true;
}

int hyena_name_group(const struct hyena_config *c, const char *name, char *group, size_t n,
                     int *piece)
{
	int l, used = 0;
	*piece = 0;
	if (sscanf(name, "layers.%d.%n", &l, &used) != 1 || used == 0)
		return 1;
	char buf[PARAM_NAME_MAX];
	for (int k = 0; k < HYB_COUNT; k++)
		for (int s = 0, g = hyena_group_size(c, k); g > 1 && s < g; s++) {
			piece_name(buf, sizeof(buf), l, hyena_names[k], s);
			if (strcmp(buf, name) == 0) {
				snprintf(group, n, "layers.%d.%s", l, hyena_names[k]);
				*piece = s;
				return g;
			}
		}
	return 1;
}

/* Every tensor draws its values as the element of safari's tensor it is (the group's one
 * tensor, global rows and columns), so the per-stream tables and every tensor-parallel slice
 * start from the weights of one rank and of the one in_proj safari has. */
void hyena_init_params(const struct hyena_config *c, const struct param_table *t, uint64_t seed,
                       float *out, int64_t first, int64_t n)
{
	int64_t last = first + n;
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i];
		int64_t lo = p->offset > first ? p->offset : first;
		int64_t hi = p->offset + p->numel < last ? p->offset + p->numel : last;
		if (lo >= hi)
			continue;
		struct param_entry g = *p; /* safari's tensor this one is a piece of */
		int l, k, s;
		int64_t row0 = 0, col0 = 0;
		if (locate(c, i, &l, &k, &s)) {
			snprintf(g.name, sizeof(g.name), "layers.%d.%s", l, hyena_names[k]);
			row0 = (int64_t)s * p->global_shape[0];
		}
		if (p->tp_dim == 0)
			row0 += p->tp_start;
		else if (p->tp_dim == 1)
			col0 = p->tp_start;
		int64_t cols = p->shape[1], gcols = p->global_shape[1];
		/* one row segment at a time: each is a contiguous range of safari's tensor */
		for (int64_t e = lo - p->offset; e < hi - p->offset;) {
			int64_t r = e / cols, c0 = e % cols;
			int64_t cnt = cols - c0 < hi - p->offset - e ? cols - c0 : hi - p->offset - e;
			param_init_fill(&g, seed, out + (p->offset + e - first),
			                (row0 + r) * gcols + col0 + c0, cnt);
			e += cnt;
		}
	}
}

/* ---------------------------------------------------------------- compute */

#define HREAL    float
#define HK(name) name##_f32
#define HT(name) hy_##name##_f32
#define HUW(m)   (m)->unit_w
#define HUDW(m)  (m)->unit_dw
#include "model/hyena/hyena_impl.h"
#undef HREAL
#undef HK
#undef HT
#undef HUW
#undef HUDW

#define HREAL    double
#define HK(name) name##_f64
#define HT(name) hy_##name##_f64
#define HUW(m)   (m)->unit_w64
#define HUDW(m)  (m)->unit_dw64
#include "model/hyena/hyena_impl.h"
#undef HREAL
#undef HK
#undef HT
#undef HUW
#undef HUDW

int64_t hyena_filter_scratch_reals(const struct hyena_config *c, int64_t L)
{
	return L * c->emb_dim + L * (c->order - 1) * c->dim + 6 * L * c->filter_order;
}

/* block_params: the block's unit buffer (table order). Features over l_max = max(L, l_max). */
#define FILTER_COMPUTE(HREAL, S, FN)                                                               \
	void FN(const struct hyena_config *c, const HREAL *block_params, int64_t L, HREAL *h,      \
	        HREAL *scratch)                                                                    \
	{                                                                                          \
		struct param_table t;                                                              \
		hyena_table_build(&t, c);                                                          \
		HREAL *w[HYB_COUNT];                                                               \
		int64_t base = t.unit_begin[1], Cf = (c->order - 1) * c->dim;                      \
		for (int k = 0; k < HYB_COUNT; k++)                                                \
			w[k] = (HREAL *)block_params +                                             \
			       (t.p[hyena_block_tensor_index(c, 0, k)].offset - base);             \
		HREAL *z = scratch, *win = z + L * c->emb_dim, *fa = win + L * Cf;                 \
		int64_t lmax = c->l_max > L ? c->l_max : L;                                        \
		hyena_filter_features##S(z, win, L, lmax, c->emb_dim, Cf);                         \
		hy_filter_forward##S(c, c->dim, w, z, win, L, h, fa);                                    \
		param_table_free(&t);                                                              \
	}
FILTER_COMPUTE(float, _f32, hyena_filter_compute)
FILTER_COMPUTE(double, _f64, hyena_filter_compute_f64)

/* ---------------------------------------------------------------- build */

static int64_t carve(int64_t *off, int64_t n)
{
	int64_t at = *off;
	*off += (n + 15) / 16 * 16;
	return at;
}

/* The activations a block under checkpointing mode b does not keep (they live in the set all
 * such blocks share): hyena_build_opts says what each mode keeps. */
enum { HA_STAT1 = 1, HA_P = 2, HA_MIX = 4, HA_MID = 8, HA_A = 16, HA_FILT = 32 };

static int dropped(enum model_ac b)
{
	switch (b) {
	case MODEL_AC_FULL:
		return HA_STAT1 | HA_P | HA_MIX | HA_MID | HA_A | HA_FILT;
	case MODEL_AC_SELECTIVE:
		return HA_MIX | HA_FILT;
	case MODEL_AC_FFN:
		return HA_A;
	default:
		return 0;
	}
}

/* Carve the fields of a in mask (the others left as they are). */
static void carve_block(const struct hyena_model *m, struct hyena_block_acts *a, int mask,
                        int64_t *off)
{
	const struct hyena_config *c = &m->cfg;
	int64_t Nt = m->N, T = m->T, D = m->Dl, P = (c->order + 1) * D;
	int64_t Cf = (c->order - 1) * D;
	if (mask & HA_STAT1) {
		a->mean1 = carve(off, Nt);
		a->rstd1 = carve(off, Nt);
	}
	if (mask & HA_P)
		a->p = carve(off, Nt * P);
	if (mask & HA_MIX) {
		a->pc = carve(off, Nt * P);
		a->g = carve(off, (c->order - 1) * Nt * D);
		a->v = carve(off, (c->order - 1) * Nt * D);
		a->y = carve(off, Nt * D);
	}
	if (mask & HA_MID) {
		a->xmid = carve(off, Nt * c->dim);
		a->mean2 = carve(off, Nt);
		a->rstd2 = carve(off, Nt);
	}
	if (mask & HA_A)
		a->a = carve(off, Nt * m->Hl);
	if (mask & HA_FILT) {
		a->fa = carve(off, 6 * T * c->filter_order);
		a->Hf = carve(off, Cf * fftconv_spectrum_stride(T));
	}
}

static void plan_acts(struct hyena_model *m, int64_t *off)
{
	const struct hyena_config *c = &m->cfg;
	int64_t Nt = m->N, T = m->T, D = c->dim;
	int64_t Cf = (c->order - 1) * m->Dl, V = c->vocab_size;
	const int all = HA_STAT1 | HA_P | HA_MIX | HA_MID | HA_A | HA_FILT;
	/* a stage's units [lo, hi): block l is unit l + 1; the residual stream's buffer j (block
	 * j's input, x_final for j = L) is unit j's output, so the stage holds j in
	 * [lo - 1, hi - 1]; every other offset stays -1 (the units CHECK they are the stage's) */
	int lo = m->unit_lo, hi = m->unit_hi, L = (int)c->n_layers, shared = 0;
	for (int l = 0; l < L; l++)
		if (lo <= l + 1 && l + 1 < hi)
			shared |= dropped(model_ac_block(m->ac, m->ac_every, l));
	struct hyena_block_acts sh = {0};
	carve_block(m, &sh, shared, off);
	for (int l = 0; l < L; l++) {
		struct hyena_block_acts *a = &m->blk[l];
		bool mine = lo <= l + 1 && l + 1 < hi;
		memset(a, 0xff, sizeof(*a)); /* -1: not this stage's */
		if (l >= lo - 1 && l <= hi - 1)
			a->x = carve(off, Nt * D);
		if (!mine)
			continue;
		int d = dropped(model_ac_block(m->ac, m->ac_every, l));
		int64_t x = a->x;
		*a = sh;
		a->x = x;
		carve_block(m, a, all & ~d, off);
	}
	bool head = hi == L + 2;
	m->x_final = L >= lo - 1 && L <= hi - 1 ? carve(off, Nt * D) : -1;
	m->mean_f = head ? carve(off, Nt) : -1;
	m->rstd_f = head ? carve(off, Nt) : -1;
	m->xn_final = head ? carve(off, Nt * D) : -1;
	m->z = carve(off, T * c->emb_dim);
	m->window = carve(off, T * Cf);
	m->tied_w = carve(off, m->own_params ? 0 : V * D);
	m->tied_dw = carve(off, V * D);
}

static void plan_scratch(struct hyena_model *m, int64_t *off)
{
	const struct hyena_config *c = &m->cfg;
	int64_t Nt = m->N, T = m->T, D = c->dim, Dl = m->Dl, P = (c->order + 1) * Dl;
	int64_t Cf = (c->order - 1) * Dl, H = m->Hl, F = c->filter_order;
	m->s_dres = carve(off, Nt * D);
	m->s_xn = carve(off, Nt * D);
	m->s_dxn = carve(off, Nt * D);
	m->s_gl = carve(off, Nt * H);
	m->s_dgl = carve(off, Nt * H);
	m->s_da = carve(off, Nt * H);
	m->s_dy = carve(off, Nt * Dl);
	m->s_dv = carve(off, Nt * Dl);
	m->s_dg = carve(off, Nt * Dl);
	m->s_dpc = carve(off, Nt * P);
	m->s_dp = carve(off, Nt * P);
	m->s_h = carve(off, T * Cf);
	m->s_dh = carve(off, T * Cf);
	m->s_filt = carve(off, T * (Cf + 2 * F));
	m->s_fft = carve(off, fftconv_scratch_reals(T, m->nthreads));
	m->s_ce = carve(off, m->ce_rows * c->vocab_size);
	/* tensor parallelism: a row-parallel output's partial sum; the implicit filter MLP's
	 * gradient of this backward (its first layers, up to the last one), all-reduced */
	bool tp = m->tp != NULL;
	m->s_part = carve(off, tp ? Nt * D : 0);
	m->s_frep = carve(off, tp ? F * c->emb_dim + 3 * F + 2 * F * F + 2 * F : 0);
}

/* The settings of a model at (B, T) under opts, without allocating: what plan_acts and
 * plan_scratch read (config, shapes, precision, threads, checkpointing, loss chunk). */
static int hyena_setup(struct hyena_model *m, const struct hyena_config *c, int64_t B, int64_t T,
                       const struct hyena_build_opts *opts)
{
	memset(m, 0, sizeof(*m));
	m->cfg = *c;
	if (m->cfg.l_max <= 0)
		m->cfg.l_max = T;
	int rc = hyena_config_finish(&m->cfg);
	if (rc)
		return rc;
	if (T > m->cfg.l_max) {
		LOG_ERROR("model.hyena_l_max: sequences of %lld tokens exceed the filter length "
		          "%lld",
		          (long long)T, (long long)m->cfg.l_max);
		return CT_ERR_USAGE;
	}
	m->B = B;
	m->T = T;
	m->N = B * T;
	m->f64 = opts->f64;
	m->own_params = opts->own_params;
	m->nthreads = opts->nthreads;
	m->ac = opts->ac;
	m->ac_every = opts->ac_every;
	m->unit_lo = opts->unit_lo;
	m->unit_hi = opts->unit_hi > 0 ? opts->unit_hi : (int)c->n_layers + 2;
	m->tp = opts->tp && opts->tp->size > 1 ? opts->tp : NULL;
	int64_t S = m->tp ? m->tp->size : 1;
	if ((rc = hyena_tp_check(&m->cfg, S)))
		return rc;
	CHECK(!m->tp || !opts->f64, "hyena: tensor parallelism runs float models");
	m->Dl = m->cfg.dim / S;
	m->Hl = m->cfg.ffn_hidden / S;
	CHECK(m->unit_lo >= 0 && m->unit_lo < m->unit_hi && m->unit_hi <= c->n_layers + 2,
	      "hyena: units [%d, %d) of %lld", m->unit_lo, m->unit_hi, (long long)c->n_layers + 2);
	CHECK(m->ac >= MODEL_AC_NONE && m->ac < MODEL_AC_COUNT &&
	          (m->ac != MODEL_AC_LAYER || m->ac_every > 0),
	      "hyena: activation checkpointing mode %d (every %d)", (int)m->ac, m->ac_every);
#ifdef _OPENMP
	if (m->nthreads <= 0)
		m->nthreads = omp_get_max_threads();
#endif
	if (m->nthreads <= 0)
		m->nthreads = 1;
	CHECK(opts->own_params || !opts->f64, "hyena: double models own their parameters");
	size_t esz = m->f64 ? sizeof(double) : sizeof(float);
	int64_t V = c->vocab_size;
	m->ce_rows = (4 << 20) / (int64_t)(esz * (size_t)V);
	m->ce_rows = m->ce_rows < 1 ? 1 : (m->ce_rows > m->N ? m->N : m->ce_rows);
	return CT_OK;
}

/* Carve the activation and scratch arenas (m->blk allocated): sets every offset and
 * act_bytes, scratch_bytes. */
static void plan_layout(struct hyena_model *m)
{
	size_t esz = m->f64 ? sizeof(double) : sizeof(float);
	int64_t off = 0;
	plan_acts(m, &off);
	m->act_bytes = off * (int64_t)esz;
	off = 0;
	plan_scratch(m, &off);
	m->scratch_bytes = off * (int64_t)esz;
}

int hyena_activation_bytes(const struct hyena_config *c, int64_t B, int64_t T,
                           const struct hyena_build_opts *opts, int64_t *bytes)
{
	struct hyena_model m;
	int rc = hyena_setup(&m, c, B, T, opts);
	if (rc)
		return rc;
	m.blk = xcalloc((size_t)c->n_layers, sizeof(*m.blk));
	plan_layout(&m);
	*bytes = m.act_bytes + m.scratch_bytes + (int64_t)(2 * m.N) * (int64_t)sizeof(int32_t);
	free(m.blk);
	return CT_OK;
}

/* The window of this rank's channels: column o*Dl + c of its (T, (N-1)Dl) is column
 * o*D + rank*Dl + c of the whole model's (the decay depends on the channel's place). */
static void tp_window(struct hyena_model *m)
{
	const struct hyena_config *c = &m->cfg;
	int64_t T = m->T, D = c->dim, Dl = m->Dl, No = c->order, Cf = (No - 1) * D;
	int64_t Cl = (No - 1) * Dl, r0 = (int64_t)m->tp->rank * Dl;
	float *all = xcalloc((size_t)(T * Cf), sizeof(float));
	float *win = (float *)m->acts + m->window;
	hyena_filter_features_f32((float *)m->acts + m->z, all, T, c->l_max, c->emb_dim, Cf);
	for (int64_t t = 0; t < T; t++)
		for (int64_t o = 0; o < No - 1; o++)
			memcpy(win + t * Cl + o * Dl, all + t * Cf + o * D + r0,
			       (size_t)Dl * sizeof(float));
	free(all);
}

int hyena_build(struct hyena_model *m, const struct hyena_config *c, int64_t B, int64_t T,
                const struct hyena_build_opts *opts)
{
	int rc = hyena_setup(m, c, B, T, opts);
	if (rc)
		return rc;
	hyena_table_build_tp(&m->table, &m->cfg, m->tp ? m->tp->size : 1,
	                     m->tp ? m->tp->rank : 0);
	size_t esz = m->f64 ? sizeof(double) : sizeof(float);

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
				hyena_bind_unit(m, u, m->params + m->table.unit_begin[u],
				                m->grads + m->table.unit_begin[u]);
		}
	}
	m->tokens = mem_alloc(MEM_ACTIVATIONS, (size_t)(2 * m->N) * sizeof(int32_t));
	m->targets = m->tokens + m->N;
	m->blk = xcalloc((size_t)c->n_layers, sizeof(*m->blk));
	plan_layout(m);
	m->acts = mem_alloc(MEM_ACTIVATIONS, (size_t)m->act_bytes);
	m->scratch = mem_alloc(MEM_ACTIVATIONS, (size_t)m->scratch_bytes);
	int64_t Cf = (c->order - 1) * c->dim;
	if (m->f64)
		hyena_filter_features_f64((double *)m->acts + m->z, (double *)m->acts + m->window,
		                          T, m->cfg.l_max, c->emb_dim, Cf);
	else if (!m->tp)
		hyena_filter_features_f32((float *)m->acts + m->z, (float *)m->acts + m->window, T,
		                          m->cfg.l_max, c->emb_dim, Cf);
	else
		tp_window(m);
	return CT_OK;
}

void hyena_free(struct hyena_model *m)
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
	mem_free(MEM_ACTIVATIONS, m->scratch, (size_t)m->scratch_bytes);
	free(m->unit_w), free(m->unit_dw), free(m->unit_w64), free(m->unit_dw64);
	free(m->blk);
	param_table_free(&m->table);
	memset(m, 0, sizeof(*m));
}

void hyena_bind_unit(struct hyena_model *m, int u, float *params, float *grads)
{
	CHECK(!m->f64, "hyena_bind_unit: float models only");
	m->unit_w[u] = params;
	m->unit_dw[u] = grads;
}

/* ---------------------------------------------------------------- units */

static void check_unit(const struct hyena_model *m, int u)
{
	CHECK(u >= m->unit_lo && u < m->unit_hi, "hyena: unit %d is not the stage's [%d, %d)", u,
	      m->unit_lo, m->unit_hi);
}

double hyena_unit_forward(struct hyena_model *m, int u, int64_t *n_valid)
{
	check_unit(m, u);
	return m->f64 ? hy_unit_forward_f64(m, u, n_valid) : hy_unit_forward_f32(m, u, n_valid);
}

void hyena_unit_backward(struct hyena_model *m, int u, double dscale)
{
	check_unit(m, u);
	if (m->f64)
		hy_unit_backward_f64(m, u, dscale);
	else
		hy_unit_backward_f32(m, u, dscale);
}

bool hyena_unit_needs_recompute(const struct hyena_model *m, int u)
{
	return u >= 1 && u <= m->cfg.n_layers &&
	       model_ac_block_recomputes(m->ac, m->ac_every, u - 1);
}

void hyena_unit_recompute(struct hyena_model *m, int u)
{
	if (!hyena_unit_needs_recompute(m, u))
		return;
	check_unit(m, u);
	if (m->f64)
		hy_unit_recompute_f64(m, u);
	else
		hy_unit_recompute_f32(m, u);
}

double hyena_forward(struct hyena_model *m, int64_t *n_valid)
{
	double loss = 0.0;
	for (int u = 0; u < m->table.n_units; u++)
		loss += hyena_unit_forward(m, u, n_valid);
	return loss;
}

void hyena_backward(struct hyena_model *m, double dscale)
{
	for (int u = m->table.n_units - 1; u >= 0; u--) {
		hyena_unit_recompute(m, u);
		hyena_unit_backward(m, u, dscale);
	}
}

void hyena_logits(struct hyena_model *m, float *logits)
{
	CHECK(m->unit_lo == 0 && m->unit_hi == m->cfg.n_layers + 2, "hyena_logits: a stage");
	CHECK(!m->f64, "hyena_logits: float model");
	hy_logits_f32(m, logits);
}

void hyena_logits_f64(struct hyena_model *m, double *logits)
{
	CHECK(m->f64, "hyena_logits_f64: double model");
	hy_logits_f64(m, logits);
}
