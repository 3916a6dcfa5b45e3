/* kernels/fp8_linear: scales, the float8 weight registry and the emulated float8 linear.
 * See fp8_linear.h. */
#include "kernels/fp8_linear.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/mm_engine.h"

static const char *const fp8_recipe_names[] = {"tensorwise", "rowwise", "rowwise_with_gw_hp"};
_Static_assert(sizeof(fp8_recipe_names) / sizeof(fp8_recipe_names[0]) == FP8_RECIPE_COUNT,
               "one name per recipe");

int fp8_recipe_parse(const char *name, enum fp8_recipe *out)
{
	for (int i = 0; i < FP8_RECIPE_COUNT; i++)
		if (strcmp(name, fp8_recipe_names[i]) == 0) {
			*out = (enum fp8_recipe)i;
			return 0;
		}
	return -1;
}

const char *fp8_recipe_name(enum fp8_recipe r)
{
	return r >= 0 && r < FP8_RECIPE_COUNT ? fp8_recipe_names[r] : "?";
}

/* ---------------------------------------------------------------- scales */

float fp8_scale_from_amax(double amax, enum fp8_fmt f, bool pow2)
{
	double a = amax > 1e-12 ? amax : 1e-12; /* torch.clamp(amax, min=EPS); NaN stays */
	float s = (float)((double)fp8_max(f) / a);
	if (pow2 && isfinite(s) && s > 0.0f)
		s = ldexpf(1.0f, ilogbf(s)); /* exp2(floor(log2(s))) */
	return s;
}

/* max(m, |v|) as fmaxf(m, fabsf(v)) for m not NaN (a NaN v leaves m), written as the compare
 * the compiler turns into maxps: fmaxf is a libm call it will not vectorise, and was most of a
 * small float8 step. */
static inline float amax_step(float m, float v)
{
	float a = fabsf(v);
	return a > m ? a : m;
}

float fp8_amax(const float *x, int64_t n)
{
	float m = 0.0f;
	/* no `simd`: clang cannot vectorise this reduction as asked and warns
	 * (-Wpass-failed); the loop is memory-bound */
#pragma omp parallel for reduction(max : m) schedule(static)
	for (int64_t i = 0; i < n; i++)
		m = amax_step(m, x[i]);
	return m;
}

void fp8_amax_rows(float *out, const float *x, int64_t rows, int64_t cols)
{
#pragma omp parallel for schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		float m = 0.0f;
		for (int64_t c = 0; c < cols; c++)
			m = amax_step(m, x[r * cols + c]);
		out[r] = m;
	}
}

void fp8_amax_cols(float *out, const float *x, int64_t rows, int64_t cols)
{
	/* column blocks per thread, rows streamed: every thread reads whole rows of its block */
#pragma omp parallel for schedule(static)
	for (int64_t c0 = 0; c0 < cols; c0 += 256) {
		int64_t c1 = c0 + 256 < cols ? c0 + 256 : cols;
		for (int64_t c = c0; c < c1; c++)
			out[c] = 0.0f;
		for (int64_t r = 0; r < rows; r++)
			for (int64_t c = c0; c < c1; c++)
				out[c] = amax_step(out[c], x[r * cols + c]);
	}
}

/* ---------------------------------------------------------------- configuration, registry */

/* An operand's or weight's amaxes as one rank takes them (fp8_block_*): of the whole tensor,
 * of each row (along the columns; NULL: each block's own rows, taken as it is cast) and of
 * each column (along the rows). rows and cols only for the rowwise recipes. */
struct fp8_amaxes {
	float tensor;
	float *rows, *cols;
};

struct fp8_entry {
	const float *w;
	int64_t rows, cols;
	int unit;
	bool prepared;
	float scale;
	struct fp8_slice slice;
	bool blk; /* amaxes taken for the open row-block scope */
	struct fp8_amaxes a;
};

static bool g_on;
static enum fp8_recipe g_recipe;
static char g_filter[512];
static struct fp8_entry *g_ent;
static int g_n, g_cap;
static const float **g_unit_base;
static int g_units;

void fp8_linear_configure(bool on, enum fp8_recipe r, const char *filter)
{
	g_on = on;
	g_recipe = r;
	snprintf(g_filter, sizeof(g_filter), "%s", filter ? filter : "");
	g_n = 0;
	for (int u = 0; u < g_units; u++)
		g_unit_base[u] = NULL;
}

bool fp8_linear_enabled(void)
{
	return g_on;
}

enum fp8_recipe fp8_linear_recipe(void)
{
	return g_recipe;
}

bool fp8_linear_wants(const char *name)
{
	if (!g_on)
		return false;
	char mod[128];
	snprintf(mod, sizeof(mod), "%s", name);
	size_t n = strlen(mod);
	if (n > 7 && strcmp(mod + n - 7, ".weight") == 0)
		mod[n - 7] = '\0';
	const char *p = g_filter;
	while (*p) {
		const char *e = strchr(p, ',');
		size_t k = e ? (size_t)(e - p) : strlen(p);
		char tok[128];
		if (k > 0 && k < sizeof(tok)) {
			memcpy(tok, p, k);
			tok[k] = '\0';
			if (strstr(mod, tok))
				return false;
		}
		p += k + (e ? 1 : 0);
	}
	return true;
}

bool fp8_linear_unit_is(int u, const float *base)
{
	return u < g_units && g_unit_base[u] == base;
}

void fp8_linear_unit_clear(int u)
{
	int k = 0;
	for (int i = 0; i < g_n; i++)
		if (g_ent[i].unit != u)
			g_ent[k++] = g_ent[i];
	g_n = k;
	if (u < g_units)
		g_unit_base[u] = NULL;
}

void fp8_linear_unit_set(int u, const float *base)
{
	if (u >= g_units) {
		int n = u + 16;
		g_unit_base = realloc(g_unit_base, (size_t)n * sizeof(*g_unit_base));
		CHECK(g_unit_base, "out of memory");
		for (int i = g_units; i < n; i++)
			g_unit_base[i] = NULL;
		g_units = n;
	}
	g_unit_base[u] = base;
}

void fp8_linear_add(int u, const float *w, int64_t rows, int64_t cols,
                    const struct fp8_slice *slice)
{
	if (g_n == g_cap) {
		g_cap = g_cap ? 2 * g_cap : 64;
		g_ent = realloc(g_ent, (size_t)g_cap * sizeof(*g_ent));
		CHECK(g_ent, "out of memory");
	}
	g_ent[g_n++] = (struct fp8_entry){.w = w, .rows = rows, .cols = cols, .unit = u,
	                                  .slice = slice ? *slice : (struct fp8_slice){.dim = -1}};
	CHECK(g_ent[g_n - 1].slice.dim < 0 || g_ent[g_n - 1].slice.max_f32,
	      "a split float8 weight needs its group's max all-reduce");
}

static struct fp8_entry *fp8_find(const float *w)
{
	for (int i = 0; i < g_n; i++)
		if (g_ent[i].w == w)
			return &g_ent[i];
	return NULL;
}

bool fp8_linear_is(const float *w)
{
	return g_on && w && fp8_find(w) != NULL;
}

void fp8_linear_set_prepared(const float *w, float scale)
{
	struct fp8_entry *e = fp8_find(w);
	CHECK(e, "fp8 prepared weight %p is not a registered float8 linear", (const void *)w);
	e->prepared = true;
	e->scale = scale;
}

/* ---------------------------------------------------------------- the emulated linear */

enum { SCR_QA, SCR_QB, SCR_TMP, SCR_IA, SCR_IB, SCR_S, SCR_COUNT };
static float *g_scr[SCR_COUNT];
static size_t g_scr_n[SCR_COUNT];

static float *scratch(int i, int64_t n)
{
	if ((size_t)n > g_scr_n[i]) {
		if (g_scr[i])
			mem_free(MEM_OTHER, g_scr[i], g_scr_n[i] * sizeof(float));
		g_scr[i] = mem_alloc(MEM_OTHER, (size_t)n * sizeof(float));
		g_scr_n[i] = (size_t)n;
	}
	return g_scr[i];
}

enum fp8_gran { GRAN_TENSOR, GRAN_ROWS, GRAN_COLS };

/* The group whose maximum an amax needs (fp8_slice in fp8_linear.h): NULL when none. */
typedef const struct fp8_slice *fp8_red;

static void reduce_amax(fp8_red r, float *a, int64_t n)
{
	if (r)
		r->max_f32(r->ctx, a, n);
}

/* The token group's maximum (context parallelism; fp8_slice.tok_max_f32): NULL when none. */
static void reduce_tok(fp8_red t, float *a, int64_t n)
{
	if (t && t->tok_max_f32)
		t->tok_max_f32(t->tok_ctx, a, n);
}

/* ---------------------------------------------------------------- row blocks */

struct fp8_block_op {
	const float *full;
	int64_t rows, cols;
	struct fp8_amaxes a;
};

static bool g_blk_on;
static struct fp8_block_op g_blk[FP8_BLOCK_MAX];
static int g_blk_n;

bool fp8_block_active(void)
{
	return g_blk_on;
}

void fp8_block_begin(void)
{
	CHECK(!g_blk_on, "fp8 row blocks: a scope is already open");
	g_blk_on = true;
	g_blk_n = 0;
}

static void amaxes_free(struct fp8_amaxes *a)
{
	free(a->rows), free(a->cols);
	memset(a, 0, sizeof(*a));
}

void fp8_block_end(void)
{
	CHECK(g_blk_on, "fp8 row blocks: no scope open");
	for (int i = 0; i < g_blk_n; i++)
		amaxes_free(&g_blk[i].a);
	for (int i = 0; i < g_n; i++)
		if (g_ent[i].blk) {
			amaxes_free(&g_ent[i].a);
			g_ent[i].blk = false;
		}
	g_blk_on = false;
	g_blk_n = 0;
}

/* x (rows x cols, all of it here): its amaxes, each along a dimension split over red's group
 * max-reduced over it (rows_split: the rows are; cols_split: the columns are), the tensorwise
 * one over tok's token group too (an activation under context parallelism). */
static void take_amaxes(struct fp8_amaxes *a, const float *x, int64_t rows, int64_t cols,
                        bool rows_split, bool cols_split, fp8_red red, fp8_red tok)
{
	memset(a, 0, sizeof(*a));
	a->tensor = rows > 0 ? fp8_amax(x, rows * cols) : 0.0f;
	if (rows_split || cols_split)
		reduce_amax(red, &a->tensor, 1);
	if (g_recipe == FP8_TENSORWISE) { /* the rowwise recipes cast no activation per tensor */
		reduce_tok(tok, &a->tensor, 1);
		return;
	}
	a->cols = xcalloc((size_t)cols, sizeof(float));
	if (rows > 0)
		fp8_amax_cols(a->cols, x, rows, cols);
	if (rows_split)
		reduce_amax(red, a->cols, cols);
	reduce_tok(tok, a->cols, cols); /* along the tokens, as the tensorwise amax */
	if (!rows_split) { /* every row is here: its amax now (a split row max-reduced) */
		a->rows = xcalloc((size_t)(rows > 0 ? rows : 1), sizeof(float));
		if (rows > 0)
			fp8_amax_rows(a->rows, x, rows, cols);
		if (cols_split)
			reduce_amax(red, a->rows, rows);
	}
}

void fp8_block_operand(const float *full, int64_t rows, int64_t cols, const float *held,
                       int64_t held_rows, enum fp8_split split, const struct fp8_slice *red)
{
	CHECK(g_blk_on, "fp8 row blocks: operand declared outside a scope");
	CHECK(g_blk_n < FP8_BLOCK_MAX, "fp8 row blocks: more than %d operands", FP8_BLOCK_MAX);
	CHECK(red && red->max_f32, "fp8 row blocks: an operand needs its group's max");
	CHECK(split == FP8_SPLIT_ROWS || (held == full && held_rows == rows),
	      "fp8 row blocks: a column-split operand is held whole");
	struct fp8_block_op *b = &g_blk[g_blk_n++];
	b->full = full;
	b->rows = rows;
	b->cols = cols;
	take_amaxes(&b->a, held, held_rows, cols, split == FP8_SPLIT_ROWS, split == FP8_SPLIT_COLS,
	            red, red);
}

void fp8_block_weight(const float *w)
{
	CHECK(g_blk_on, "fp8 row blocks: weight declared outside a scope");
	struct fp8_entry *e = fp8_find(w);
	CHECK(e, "fp8 row blocks: %p is not a registered float8 weight", (const void *)w);
	if (e->blk)
		return;
	bool split = e->slice.dim >= 0;
	take_amaxes(&e->a, e->w, e->rows, e->cols, split && e->slice.dim == 0,
	            split && e->slice.dim == 1, split ? &e->slice : NULL, NULL);
	e->blk = true;
}

/* Inside a scope: the declared operand that x (rows x cols) is a row block of, its first row
 * in *r0 (every activation a float8 linear sees there must be declared). NULL outside. */
static const struct fp8_amaxes *block_of(const float *x, int64_t rows, int64_t cols,
                                         int64_t *r0)
{
	*r0 = 0;
	if (!g_blk_on || !x)
		return NULL;
	for (int i = 0; i < g_blk_n; i++) {
		const struct fp8_block_op *b = &g_blk[i];
		if (b->cols != cols || x < b->full || x >= b->full + b->rows * cols)
			continue;
		int64_t off = x - b->full;
		CHECK(off % cols == 0 && off / cols + rows <= b->rows,
		      "fp8 row blocks: %lld rows at offset %lld leave their operand", (long long)rows,
		      (long long)off);
		*r0 = off / cols;
		return &b->a;
	}
	CHECK(false, "fp8 row blocks: a float8 linear on an undeclared %lld x %lld operand",
	      (long long)rows, (long long)cols);
	return NULL;
}

float fp8_block_amax(const float *full)
{
	for (int i = 0; i < g_blk_n; i++)
		if (g_blk[i].full == full)
			return g_blk[i].a.tensor;
	CHECK(false, "fp8 row blocks: %p was not declared", (const void *)full);
	return 0.0f;
}

/* The weight's amaxes taken for the scope, or NULL. */
static const struct fp8_amaxes *weight_block(const struct fp8_entry *e)
{
	if (!g_blk_on || !e)
		return NULL;
	CHECK(e->blk || e->slice.dim < 0 || e->prepared,
	      "fp8 row blocks: a split float8 weight not declared for the scope");
	return e->blk ? &e->a : NULL;
}

/* The weight's group when `split` (the amax runs along a split dimension), else NULL. */
static fp8_red red_if(const struct fp8_entry *e, bool split)
{
	return e && e->slice.dim >= 0 && split ? &e->slice : NULL;
}

/* The token group of the linear's activations (context parallelism), or NULL. */
static fp8_red tok_of(const struct fp8_entry *e)
{
	return e && e->slice.tok_max_f32 ? &e->slice : NULL;
}

/* q = fp8 values of x (rows x cols) under scales of granularity g; inv[] = 1/scale (1, rows
 * or cols entries); the amaxes maximised over red's group first (a tensorwise one then over
 * tok's token group: x an activation), or taken from pa (x's amaxes for a row-block scope, x
 * its rows from r0 on). */
static void quant(float *q, float *inv, const float *x, int64_t rows, int64_t cols,
                  enum fp8_gran g, enum fp8_fmt f, bool pow2, fp8_red red, fp8_red tok,
                  const struct fp8_amaxes *pa, int64_t r0)
{
	/* a row block's own rows: no group to ask (its rows are whole here) */
	bool own_rows = pa && g == GRAN_ROWS && !pa->rows;
	/* along the tokens: a tensorwise amax, and the per-column ones of the weight gradient */
	bool tok_red = g != GRAN_ROWS && tok && tok->tok_max_f32;
	CHECK(!g_blk_on || !(red || tok_red) || (pa && !own_rows),
	      "fp8 row blocks: an amax would need a collective inside a ring step");
	if (g == GRAN_TENSOR) {
		float a = pa ? pa->tensor : fp8_amax(x, rows * cols);
		if (!pa) {
			reduce_amax(red, &a, 1);
			reduce_tok(tok, &a, 1);
		}
		float s = fp8_scale_from_amax(a, f, pow2);
		inv[0] = 1.0f / s;
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < rows; r++)
			fp8_quantize_values(q + r * cols, x + r * cols, cols, s, f);
		return;
	}
	int64_t ns = g == GRAN_ROWS ? rows : cols;
	float *s = scratch(SCR_S, ns);
	if (pa && !own_rows) {
		memcpy(s, g == GRAN_ROWS ? pa->rows + r0 : pa->cols, (size_t)ns * sizeof(float));
	} else {
		if (g == GRAN_ROWS)
			fp8_amax_rows(s, x, rows, cols);
		else
			fp8_amax_cols(s, x, rows, cols);
		if (!pa) {
			reduce_amax(red, s, ns);
			if (g == GRAN_COLS)
				reduce_tok(tok, s, ns);
		}
	}
	for (int64_t i = 0; i < ns; i++) {
		s[i] = fp8_scale_from_amax(s[i], f, pow2);
		inv[i] = 1.0f / s[i];
	}
#pragma omp parallel for schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		if (g == GRAN_ROWS)
			fp8_quantize_values(q + r * cols, x + r * cols, cols, s[r], f);
		else
			fp8_quantize_values_vs(q + r * cols, x + r * cols, cols, s, f);
	}
}

/* C(M,Nn) (+)= (op(qA) op(qB)) * ia[m or 0] * ib[n or 0]: the engine multiplies the fp8
 * values exactly (they are bf16 numbers) with fp32 accumulation, then the scales apply. */
static void scaled_mm(bool ta, bool tb, int64_t M, int64_t Nn, int64_t K, const float *qa,
                      int64_t lda, const float *qb, int64_t ldb, const float *ia, bool ia_vec,
                      const float *ib, bool ib_vec, float *C, bool accumulate)
{
	float *tmp = scratch(SCR_TMP, M * Nn);
	mm_gemm(ta, tb, M, Nn, K, qa, lda, qb, ldb, 0.0f, tmp, Nn);
#pragma omp parallel for schedule(static)
	for (int64_t m = 0; m < M; m++) {
		float a = ia[ia_vec ? m : 0];
		const float *t = tmp + m * Nn;
		float *c = C + m * Nn;
		if (ib_vec) {
			if (accumulate)
				for (int64_t n = 0; n < Nn; n++)
					c[n] += t[n] * (a * ib[n]);
			else
				for (int64_t n = 0; n < Nn; n++)
					c[n] = t[n] * (a * ib[n]);
		} else {
			float s = a * ib[0];
			if (accumulate)
				for (int64_t n = 0; n < Nn; n++)
					c[n] += t[n] * s;
			else
				for (int64_t n = 0; n < Nn; n++)
					c[n] = t[n] * s;
		}
	}
}

/* The weight as the tensorwise recipes use it: prepared (values in place, known scale) or
 * cast now. Returns the values; *inv = 1/scale. */
static const float *weight_tensorwise(const float *w, int64_t OC, int64_t C, bool pow2,
                                      float *inv)
{
	const struct fp8_entry *e = fp8_find(w);
	if (e && e->prepared) {
		*inv = 1.0f / e->scale;
		return w;
	}
	float *q = scratch(SCR_QB, OC * C);
	quant(q, inv, w, OC, C, GRAN_TENSOR, FP8_E4M3, pow2, red_if(e, true), NULL, weight_block(e),
	      0);
	return q;
}

void fp8_linear_forward(float *out, const float *inp, const float *w, int64_t N, int64_t C,
                        int64_t OC, int accumulate)
{
	/* which amaxes run along a split dimension (fp8_slice): C (row parallel), OC (column
	 * parallel), or the whole weight */
	const struct fp8_entry *e = fp8_find(w);
	int dim = e ? e->slice.dim : -1;
	fp8_red rc = red_if(e, dim == 1), rt = tok_of(e);
	int64_t r0;
	const struct fp8_amaxes *px = block_of(inp, N, C, &r0); /* inside a row-block scope */
	float *qx = scratch(SCR_QA, N * C);
	if (g_recipe == FP8_TENSORWISE) {
		float ix, iw;
		quant(qx, &ix, inp, N, C, GRAN_TENSOR, FP8_E4M3, false, rc, rt, px, r0);
		const float *qw = weight_tensorwise(w, OC, C, false, &iw);
		scaled_mm(false, true, N, OC, C, qx, C, qw, C, &ix, false, &iw, false, out,
		          accumulate);
		return;
	}
	/* rowwise, rowwise_with_gw_hp: x per row, w per row (both along C) */
	float *ix = scratch(SCR_IA, N), *iw = scratch(SCR_IB, OC), *qw = scratch(SCR_QB, OC * C);
	quant(qx, ix, inp, N, C, GRAN_ROWS, FP8_E4M3, true, rc, NULL, px, r0);
	quant(qw, iw, w, OC, C, GRAN_ROWS, FP8_E4M3, true, rc, NULL, weight_block(e), 0);
	scaled_mm(false, true, N, OC, C, qx, C, qw, C, ix, true, iw, true, out, accumulate);
}

void fp8_linear_backward(float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, int64_t N, int64_t C, int64_t OC, int dinp_acc)
{
	/* which amaxes run along a split dimension (fp8_slice): C (row parallel), OC (column
	 * parallel), or the whole weight */
	const struct fp8_entry *e = fp8_find(w);
	int dim = e ? e->slice.dim : -1;
	fp8_red rc = red_if(e, dim == 1), ro = red_if(e, dim == 0), rw = red_if(e, true),
	        rt = tok_of(e);
	/* inside a row-block scope: the amaxes taken for it (x only where it is cast) */
	int64_t d0, x0;
	const struct fp8_amaxes *pd = block_of(dout, N, OC, &d0), *pw = weight_block(e);
	bool cast_x = dw && g_recipe != FP8_ROWWISE_GW_HP;
	const struct fp8_amaxes *px = cast_x ? block_of(inp, N, C, &x0) : NULL;
	float *qd = scratch(SCR_QA, N * OC);
	if (g_recipe == FP8_TENSORWISE) {
		float id, iw, ix;
		quant(qd, &id, dout, N, OC, GRAN_TENSOR, FP8_E5M2, false, ro, rt, pd, d0);
		if (dinp) {
			const float *qw = weight_tensorwise(w, OC, C, false, &iw);
			scaled_mm(false, false, N, C, OC, qd, OC, qw, C, &id, false, &iw, false, dinp,
			          dinp_acc);
		}
		if (dw) {
			/* qd stays in SCR_QA; x goes to QB (the weight's values are not needed now) */
			float *qx = scratch(SCR_QB, N * C);
			quant(qx, &ix, inp, N, C, GRAN_TENSOR, FP8_E4M3, false, rc, rt, px, x0);
			scaled_mm(true, false, OC, C, N, qd, OC, qx, C, &id, false, &ix, false, dw,
			          true);
		}
		return;
	}
	if (dinp) {
		/* dx(N,C) = dy(N,OC) w(OC,C): dy per row; w per column (rowwise) or tensorwise */
		float *id = scratch(SCR_IA, N), *qw = scratch(SCR_QB, OC * C);
		quant(qd, id, dout, N, OC, GRAN_ROWS, FP8_E4M3, true, ro, NULL, pd, d0);
		if (g_recipe == FP8_ROWWISE) {
			float *iw = scratch(SCR_IB, C);
			quant(qw, iw, w, OC, C, GRAN_COLS, FP8_E4M3, true, ro, NULL, pw, 0);
			scaled_mm(false, false, N, C, OC, qd, OC, qw, C, id, true, iw, true, dinp,
			          dinp_acc);
		} else {
			float iw;
			quant(qw, &iw, w, OC, C, GRAN_TENSOR, FP8_E4M3, true, rw, NULL, pw, 0);
			scaled_mm(false, false, N, C, OC, qd, OC, qw, C, id, true, &iw, false, dinp,
			          dinp_acc);
		}
	}
	if (dw) {
		if (g_recipe == FP8_ROWWISE_GW_HP) {
			/* dw(OC,C) += dy^T x in high precision */
			mm_gemm(true, false, OC, C, N, dout, OC, inp, C, 1.0f, dw, C);
			return;
		}
		/* dw(OC,C) = dy^T(OC,N) x(N,C): both per column (along N) */
		float *id = scratch(SCR_IA, OC), *ix = scratch(SCR_IB, C),
		      *qx = scratch(SCR_QB, N * C);
		quant(qd, id, dout, N, OC, GRAN_COLS, FP8_E4M3, true, NULL, rt, pd, d0);
		quant(qx, ix, inp, N, C, GRAN_COLS, FP8_E4M3, true, NULL, rt, px, x0);
		scaled_mm(true, false, OC, C, N, qd, OC, qx, C, id, true, ix, true, dw, true);
	}
}
