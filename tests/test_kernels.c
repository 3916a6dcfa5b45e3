/* Kernel tests: every backward against central finite differences in double precision
 * (relative error < 1e-6), and the float kernels against the double ones. Attention has its
 * own file (test_attention.c). Fresh random inputs each run (seed printed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "testutil.h"

#define FD_TOL 1e-6

/* ------------------------------------------------------------ finite-difference driver */

/* A scalar loss of the kernel's inputs: L = sum(out * G) for a random G. */
typedef double (*loss_fn)(void *ctx);

static double *dalloc(int64_t n)
{
	return calloc((size_t)n, sizeof(double));
}

static double fd_check(const char *what, double *x, int64_t n, loss_fn f, void *ctx,
                       const double *analytic)
{
	double *num = dalloc(n);
	for (int64_t i = 0; i < n; i++) {
		double h = 1e-5 * fmax(1.0, fabs(x[i]));
		double keep = x[i];
		x[i] = keep + h;
		double lp = f(ctx);
		x[i] = keep - h;
		double lm = f(ctx);
		x[i] = keep;
		num[i] = (lp - lm) / (2 * h);
	}
	double err = rel_err_f64(analytic, num, n);
	EXPECT(err < FD_TOL, "%s: finite-difference rel err %.3e", what, err);
	free(num);
	return err;
}

static double dot(const double *a, const double *b, int64_t n)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

static float *to_f32(const double *x, int64_t n)
{
	float *y = malloc((size_t)n * sizeof(float));
	for (int64_t i = 0; i < n; i++)
		y[i] = (float)x[i];
	return y;
}

static double rel_f32_f64(const float *a, const double *b, int64_t n)
{
	double *t = dalloc(n);
	for (int64_t i = 0; i < n; i++)
		t[i] = a[i];
	double e = rel_err_f64(t, b, n);
	free(t);
	return e;
}

/* ------------------------------------------------------------ rmsnorm */

struct rms_ctx {
	double *x, *w, *g, *out, *rstd;
	int64_t N, C;
};

static double rms_loss(void *p)
{
	struct rms_ctx *c = p;
	rmsnorm_forward_f64(c->out, c->rstd, c->x, c->w, c->N, c->C, 1e-5);
	return dot(c->out, c->g, c->N * c->C);
}

TEST_CASE(test_rmsnorm)
{
	int64_t N = 7, C = 13;
	struct rms_ctx c = {
	    dalloc(N * C), dalloc(C), dalloc(N * C), dalloc(N * C), dalloc(N), N, C};
	test_fill(c.x, N * C, -2, 2);
	test_fill(c.w, C, 0.5, 1.5);
	test_fill(c.g, N * C, -1, 1);
	double *dx = dalloc(N * C), *dw = dalloc(C);
	rms_loss(&c);
	rmsnorm_backward_f64(dx, dw, c.g, c.x, c.w, c.rstd, N, C);
	fd_check("rmsnorm dx", c.x, N * C, rms_loss, &c, dx);
	fd_check("rmsnorm dw", c.w, C, rms_loss, &c, dw);
	/* float vs double */
	float *xf = to_f32(c.x, N * C), *wf = to_f32(c.w, C), *gf = to_f32(c.g, N * C);
	float *of = calloc((size_t)(N * C), 4), *rf = calloc((size_t)N, 4);
	float *dxf = calloc((size_t)(N * C), 4), *dwf = calloc((size_t)C, 4);
	rmsnorm_forward_f32(of, rf, xf, wf, N, C, 1e-5);
	rmsnorm_backward_f32(dxf, dwf, gf, xf, wf, rf, N, C);
	rms_loss(&c);
	EXPECT(rel_f32_f64(of, c.out, N * C) < 1e-6, "rmsnorm f32 forward");
	EXPECT(rel_f32_f64(dxf, dx, N * C) < 1e-5, "rmsnorm f32 dx");
	EXPECT(rel_f32_f64(dwf, dw, C) < 1e-5, "rmsnorm f32 dw");
	free(xf), free(wf), free(gf), free(of), free(rf), free(dxf), free(dwf);
	free(c.x), free(c.w), free(c.g), free(c.out), free(c.rstd), free(dx), free(dw);
}

/* ------------------------------------------------------------ matmul */

struct mm_ctx {
	double *inp, *w, *g, *out;
	int64_t N, C, OC;
};

static double mm_loss(void *p)
{
	struct mm_ctx *c = p;
	matmul_forward_f64(c->out, c->inp, c->w, c->N, c->C, c->OC, 0);
	return dot(c->out, c->g, c->N * c->OC);
}

TEST_CASE(test_matmul)
{
	int64_t N = 9, C = 11, OC = 5;
	struct mm_ctx c = {dalloc(N * C), dalloc(OC * C), dalloc(N * OC), dalloc(N * OC), N, C, OC};
	test_fill(c.inp, N * C, -1, 1);
	test_fill(c.w, OC * C, -1, 1);
	test_fill(c.g, N * OC, -1, 1);
	double *dinp = dalloc(N * C), *dw = dalloc(OC * C);
	matmul_backward_f64(dinp, dw, c.g, c.inp, c.w, N, C, OC);
	fd_check("matmul dinp", c.inp, N * C, mm_loss, &c, dinp);
	fd_check("matmul dw", c.w, OC * C, mm_loss, &c, dw);
	/* accumulate flag: out += inp w^T */
	double *o2 = dalloc(N * OC);
	memcpy(o2, c.g, sizeof(double) * (size_t)(N * OC));
	matmul_forward_f64(o2, c.inp, c.w, N, C, OC, 1);
	mm_loss(&c);
	for (int64_t i = 0; i < N * OC; i++)
		o2[i] -= c.g[i];
	EXPECT(rel_err_f64(o2, c.out, N * OC) < 1e-14, "matmul accumulate");
	/* matmul_backward_set overwrites dinp (whatever it held) and still adds into dw */
	double *dinp2 = dalloc(N * C), *dw2 = dalloc(OC * C);
	test_fill(dinp2, N * C, -5, 5);
	matmul_backward_set_f64(dinp2, dw2, c.g, c.inp, c.w, N, C, OC);
	EXPECT(memcmp(dinp2, dinp, sizeof(double) * (size_t)(N * C)) == 0 &&
	           memcmp(dw2, dw, sizeof(double) * (size_t)(OC * C)) == 0,
	       "matmul_backward_set: dinp not overwritten or dw not the same");
	matmul_backward_set_f64(dinp2, dw2, c.g, c.inp, c.w, N, C, OC);
	EXPECT(memcmp(dinp2, dinp, sizeof(double) * (size_t)(N * C)) == 0 &&
	           rel_err_f64(dw2, dw, OC * C) > 0.5,
	       "matmul_backward_set twice: dinp must stay, dw must accumulate");
	size_t fz = sizeof(float);
	float *fi = malloc(fz * (size_t)(N * C)), *fw = malloc(fz * (size_t)(OC * C)),
	      *fg = malloc(fz * (size_t)(N * OC)), *fa = calloc((size_t)(N * C), fz),
	      *fb = malloc(fz * (size_t)(N * C));
	for (int64_t i = 0; i < N * C; i++)
		fi[i] = (float)c.inp[i], fb[i] = 1e3f * (float)c.inp[i];
	for (int64_t i = 0; i < OC * C; i++)
		fw[i] = (float)c.w[i];
	for (int64_t i = 0; i < N * OC; i++)
		fg[i] = (float)c.g[i];
	matmul_backward_f32(fa, NULL, fg, fi, fw, N, C, OC);
	matmul_backward_set_f32(fb, NULL, fg, fi, fw, N, C, OC);
	EXPECT(memcmp(fa, fb, sizeof(float) * (size_t)(N * C)) == 0,
	       "matmul_backward_set_f32 differs from accumulating into zeros");
	free(fi), free(fw), free(fg), free(fa), free(fb), free(dinp2), free(dw2);
	free(o2), free(c.inp), free(c.w), free(c.g), free(c.out), free(dinp), free(dw);
}

/* ------------------------------------------------------------ embedding */

TEST_CASE(test_embedding)
{
	int64_t N = 23, C = 6, V = 5; /* repeated tokens exercise the scatter-add */
	int32_t tok[23];
	for (int i = 0; i < N; i++)
		tok[i] = (int32_t)(test_uniform(0, V));
	double *wte = dalloc(V * C), *out = dalloc(N * C), *g = dalloc(N * C), *dw = dalloc(V * C);
	test_fill(wte, V * C, -1, 1);
	test_fill(g, N * C, -1, 1);
	embedding_forward_f64(out, tok, wte, N, C);
	for (int64_t n = 0; n < N; n++)
		EXPECT(memcmp(out + n * C, wte + tok[n] * C, sizeof(double) * (size_t)C) == 0,
		       "embedding row %lld", (long long)n);
	embedding_backward_f64(dw, g, tok, N, C);
	/* L = sum(out*g) is linear in wte, so FD is exact up to rounding */
	double *num = dalloc(V * C);
	for (int64_t i = 0; i < V * C; i++) {
		double keep = wte[i];
		wte[i] = keep + 1e-3;
		embedding_forward_f64(out, tok, wte, N, C);
		double lp = dot(out, g, N * C);
		wte[i] = keep - 1e-3;
		embedding_forward_f64(out, tok, wte, N, C);
		double lm = dot(out, g, N * C);
		wte[i] = keep;
		num[i] = (lp - lm) / 2e-3;
	}
	EXPECT(rel_err_f64(dw, num, V * C) < FD_TOL, "embedding dwte");
	free(wte), free(out), free(g), free(dw), free(num);
}

/* ------------------------------------------------------------ rope */

struct rope_ctx {
	double *x, *y, *g, *cs, *sn;
	int64_t B, T, NH, D;
};

static double rope_loss(void *p)
{
	struct rope_ctx *c = p;
	int64_t n = c->B * c->T * c->NH * c->D;
	memcpy(c->y, c->x, sizeof(double) * (size_t)n);
	rope_forward_f64(c->y, c->cs, c->sn, c->B, c->T, c->NH, c->D);
	return dot(c->y, c->g, n);
}

TEST_CASE(test_rope)
{
	int64_t B = 2, T = 5, NH = 3, D = 8, n = B * T * NH * D;
	struct rope_ctx c = {
	    dalloc(n), dalloc(n), dalloc(n), dalloc(T * D / 2), dalloc(T * D / 2), B, T, NH, D};
	test_fill(c.x, n, -1, 1);
	test_fill(c.g, n, -1, 1);
	for (int64_t t = 0; t < T; t++)
		for (int64_t i = 0; i < D / 2; i++) {
			double ang = (double)t * pow(500000.0, -2.0 * (double)i / (double)D);
			c.cs[t * D / 2 + i] = cos(ang);
			c.sn[t * D / 2 + i] = sin(ang);
		}
	double *dx = dalloc(n);
	memcpy(dx, c.g, sizeof(double) * (size_t)n);
	rope_backward_f64(dx, c.cs, c.sn, B, T, NH, D);
	fd_check("rope dx", c.x, n, rope_loss, &c, dx);
	/* norm preserved per pair; inverse rotation restores the input */
	rope_loss(&c);
	rope_backward_f64(c.y, c.cs, c.sn, B, T, NH, D);
	EXPECT(rel_err_f64(c.y, c.x, n) < 1e-14, "rope inverse");
	free(c.x), free(c.y), free(c.g), free(c.cs), free(c.sn), free(dx);
}

/* ------------------------------------------------------------ swiglu */

struct sw_ctx {
	double *a, *b, *g, *out;
	int64_t n;
};

static double sw_loss(void *p)
{
	struct sw_ctx *c = p;
	swiglu_forward_f64(c->out, c->a, c->b, c->n);
	return dot(c->out, c->g, c->n);
}

TEST_CASE(test_swiglu)
{
	int64_t n = 37;
	struct sw_ctx c = {dalloc(n), dalloc(n), dalloc(n), dalloc(n), n};
	test_fill(c.a, n, -6, 6);
	test_fill(c.b, n, -2, 2);
	test_fill(c.g, n, -1, 1);
	double *da = dalloc(n), *db = dalloc(n);
	swiglu_backward_f64(da, db, c.g, c.a, c.b, n);
	fd_check("swiglu da", c.a, n, sw_loss, &c, da);
	fd_check("swiglu db", c.b, n, sw_loss, &c, db);
	float *af = to_f32(c.a, n), *bf = to_f32(c.b, n), *of = calloc((size_t)n, 4);
	swiglu_forward_f32(of, af, bf, n);
	sw_loss(&c);
	EXPECT(rel_f32_f64(of, c.out, n) < 1e-6, "swiglu f32 (fast exp) vs f64: %.3e",
	       rel_f32_f64(of, c.out, n));
	free(af), free(bf), free(of);
	free(c.a), free(c.b), free(c.g), free(c.out), free(da), free(db);
}

/* ------------------------------------------------------------ fused cross-entropy */

struct ce_ctx {
	double *x, *w, *scratch;
	int32_t *tgt;
	int64_t N, C, V, chunk;
	double dscale;
};

static double ce_loss(void *p)
{
	struct ce_ctx *c = p;
	return c->dscale * cross_entropy_fused_f64(NULL, NULL, c->x, c->w, c->tgt, c->N, c->C, c->V,
	                                           -100, 0.0, c->scratch, c->chunk, NULL);
}

TEST_CASE(test_cross_entropy)
{
	int64_t N = 11, C = 7, V = 19, chunk = 4; /* chunks of 4, 4, 3 */
	int32_t tgt[11];
	for (int i = 0; i < N; i++)
		tgt[i] = (i % 4 == 2) ? -100 : (int32_t)test_uniform(0, V);
	struct ce_ctx c = {dalloc(N * C), dalloc(V * C), dalloc(chunk * V), tgt, N, C, V, chunk, 0};
	test_fill(c.x, N * C, -1, 1);
	test_fill(c.w, V * C, -1, 1);
	int64_t valid = 0;
	double *dx = dalloc(N * C), *dw = dalloc(V * C);
	double sum = cross_entropy_fused_f64(dx, dw, c.x, c.w, tgt, N, C, V, -100, 0.0, c.scratch,
	                                     chunk, &valid);
	EXPECT(valid == 8, "valid count %lld", (long long)valid);
	c.dscale = 1.0 / (double)valid;
	memset(dx, 0, sizeof(double) * (size_t)(N * C));
	memset(dw, 0, sizeof(double) * (size_t)(V * C));
	double sum2 = cross_entropy_fused_f64(dx, dw, c.x, c.w, tgt, N, C, V, -100, c.dscale,
	                                      c.scratch, chunk, NULL);
	EXPECT(sum == sum2, "loss independent of gradient pass");
	/* reference loss: full logits, log-softmax */
	double ref = 0;
	for (int64_t n = 0; n < N; n++) {
		if (tgt[n] == -100)
			continue;
		double z[19], mx = -1e300, s = 0;
		for (int64_t v = 0; v < V; v++) {
			z[v] = dot(c.x + n * C, c.w + v * C, C);
			mx = fmax(mx, z[v]);
		}
		for (int64_t v = 0; v < V; v++)
			s += exp(z[v] - mx);
		ref += mx + log(s) - z[tgt[n]];
	}
	EXPECT(fabs(sum - ref) < 1e-12 * fabs(ref), "ce loss %.15g vs %.15g", sum, ref);
	fd_check("cross-entropy dx", c.x, N * C, ce_loss, &c, dx);
	fd_check("cross-entropy dw", c.w, V * C, ce_loss, &c, dw);
	/* ignored rows get no gradient */
	for (int64_t n = 2; n < N; n += 4)
		for (int64_t k = 0; k < C; k++)
			EXPECT(dx[n * C + k] == 0.0, "ignored row has gradient");
	/* float */
	float *xf = to_f32(c.x, N * C), *wf = to_f32(c.w, V * C),
	      *sf = calloc((size_t)(chunk * V), 4);
	float *dxf = calloc((size_t)(N * C), 4), *dwf = calloc((size_t)(V * C), 4);
	double sumf = cross_entropy_fused_f32(dxf, dwf, xf, wf, tgt, N, C, V, -100, c.dscale, sf,
	                                      chunk, NULL);
	EXPECT(fabs(sumf - ref) < 1e-5 * fabs(ref), "ce f32 loss");
	EXPECT(rel_f32_f64(dxf, dx, N * C) < 1e-5, "ce f32 dx");
	EXPECT(rel_f32_f64(dwf, dw, V * C) < 1e-5, "ce f32 dw");
	free(xf), free(wf), free(sf), free(dxf), free(dwf);
	free(c.x), free(c.w), free(c.scratch), free(dx), free(dw);
}

/* ------------------------------------------------------------ adamw */

TEST_CASE(test_adamw)
{
	/* Against the textbook update computed in double for 3 steps. */
	int64_t n = 33;
	float p[33], g[33], m[33] = {0}, v[33] = {0};
	double pd[33], md[33] = {0}, vd[33] = {0};
	test_fill_f32(p, n, -1, 1);
	for (int i = 0; i < n; i++)
		pd[i] = p[i];
	double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.7;
	for (int t = 1; t <= 3; t++) {
		test_fill_f32(g, n, -1, 1);
		adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
		for (int i = 0; i < n; i++) {
			double gi = (double)g[i] * gs;
			pd[i] *= 1 - lr * wd;
			md[i] = b1 * md[i] + (1 - b1) * gi;
			vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
			double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
			pd[i] -= lr * mh / (sqrt(vh) + eps);
		}
	}
	EXPECT(rel_f32_f64(p, pd, n) < 1e-6, "adamw vs textbook: %.3e", rel_f32_f64(p, pd, n));
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)p[i] * p[i];
	EXPECT(fabs(sumsq_f32(p, n) - ss) < 1e-12 * ss, "sumsq");
}

int main(void)
{
	test_seed();
	RUN(test_rmsnorm);
	RUN(test_matmul);
	RUN(test_embedding);
	RUN(test_rope);
	RUN(test_swiglu);
	RUN(test_cross_entropy);
	RUN(test_adamw);
	return test_summary();
}
