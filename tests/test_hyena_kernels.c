/* Hyena kernel tests: every backward against central finite differences in double precision
 * (relative error < 1e-6), the FFT long convolution against its direct twin (forward and all
 * gradients; fp64 1e-12, fp32 1e-5) for T = 1, 2, 3, odd, 2^k and non-smooth lengths, and the
 * float kernels against the double ones. Fresh random inputs each run (seed printed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/hyena_kernels.h"
#include "kernels/kernels.h"
#include "testutil.h"

#define FD_TOL 1e-6

typedef double (*loss_fn)(void *ctx);

static double *dalloc(int64_t n)
{
	return calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

static float *to_f32(const double *x, int64_t n)
{
	float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
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

static double dot(const double *a, const double *b, int64_t n)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* central differences of f with respect to x[0..n), compared with analytic */
static void fd_check(const char *what, double *x, int64_t n, loss_fn f, void *ctx,
                     const double *analytic)
{
	double *num = dalloc(n);
	for (int64_t i = 0; i < n; i++) {
		double h = 1e-5 * fmax(1.0, fabs(x[i])), keep = x[i];
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
}

/* ------------------------------------------------------------ long convolution */

struct conv_ctx {
	double *x, *h, *bias, *g, *y;
	int64_t B, T, C, ld;
};

static double conv_loss(void *p)
{
	struct conv_ctx *c = p;
	longconv_forward_direct_f64(c->y, c->x, c->h, c->ld, c->bias, c->B, c->T, c->C);
	return dot(c->y, c->g, c->B * c->T * c->C);
}

static void conv_case(int64_t B, int64_t T, int64_t C, bool fd)
{
	int64_t ld = C + 2, n = B * T * C; /* filter columns inside a wider matrix */
	struct conv_ctx c = {dalloc(n), dalloc(T * ld), dalloc(C), dalloc(n), dalloc(n), B, T, C,
	                     ld};
	test_fill(c.x, n, -1, 1);
	test_fill(c.h, T * ld, -1, 1);
	test_fill(c.bias, C, -1, 1);
	test_fill(c.g, n, -1, 1);
	double *dx = dalloc(n), *dh = dalloc(T * ld), *db = dalloc(C);
	conv_loss(&c);
	longconv_backward_direct_f64(dx, dh, ld, db, c.g, c.x, c.h, c.bias, B, T, C);
	if (fd) {
		fd_check("longconv dx", c.x, n, conv_loss, &c, dx);
		fd_check("longconv dh", c.h, T * ld, conv_loss, &c, dh);
		fd_check("longconv dbias", c.bias, C, conv_loss, &c, db);
		conv_loss(&c); /* y at the unperturbed inputs again */
	}
	/* FFT (double) vs direct */
	int64_t S = fftconv_spectrum_stride(T);
	double *Hf = dalloc(C * S), *scr = dalloc(fftconv_scratch_reals(T, 4)), *y = dalloc(n);
	double *dx2 = dalloc(n), *dh2 = dalloc(T * ld), *db2 = dalloc(C);
	fftconv_filter_spectrum_f64(Hf, c.h, ld, T, C, scr, 4);
	fftconv_forward_f64(y, c.x, Hf, c.bias, B, T, C, scr, 4);
	fftconv_backward_f64(dx2, dh2, ld, db2, c.g, c.x, Hf, c.bias, B, T, C, scr, 4);
	double ey = rel_err_f64(y, c.y, n), edx = rel_err_f64(dx2, dx, n);
	double edh = rel_err_f64(dh2, dh, T * ld), edb = rel_err_f64(db2, db, C);
	EXPECT(ey < 1e-12 && edx < 1e-12 && edh < 1e-12 && edb < 1e-12,
	       "fft vs direct (f64) B=%lld T=%lld C=%lld: y %.2e dx %.2e dh %.2e dbias %.2e",
	       (long long)B, (long long)T, (long long)C, ey, edx, edh, edb);
	/* FFT (float) vs direct (double) */
	float *xf = to_f32(c.x, n), *hf = to_f32(c.h, T * ld), *bf = to_f32(c.bias, C);
	float *gf = to_f32(c.g, n), *Hff = calloc((size_t)(C * S), 4);
	float *scrf = calloc((size_t)fftconv_scratch_reals(T, 4), 4), *yf = calloc((size_t)n, 4);
	float *dxf = calloc((size_t)n, 4), *dhf = calloc((size_t)(T * ld), 4);
	float *dbf = calloc((size_t)C, 4);
	fftconv_filter_spectrum_f32(Hff, hf, ld, T, C, scrf, 4);
	fftconv_forward_f32(yf, xf, Hff, bf, B, T, C, scrf, 4);
	fftconv_backward_f32(dxf, dhf, ld, dbf, gf, xf, Hff, bf, B, T, C, scrf, 4);
	ey = rel_f32_f64(yf, c.y, n);
	edx = rel_f32_f64(dxf, dx, n);
	edh = rel_f32_f64(dhf, dh, T * ld);
	edb = rel_f32_f64(dbf, db, C);
	/* float: each output sums T products; FFT rounding grows ~log n, far below 1e-5 */
	EXPECT(ey < 1e-5 && edx < 1e-5 && edh < 1e-5 && edb < 1e-5,
	       "fft f32 vs direct B=%lld T=%lld: y %.2e dx %.2e dh %.2e dbias %.2e", (long long)B,
	       (long long)T, ey, edx, edh, edb);
	free(xf), free(hf), free(bf), free(gf), free(Hff), free(scrf), free(yf), free(dxf);
	free(dhf), free(dbf);
	free(Hf), free(scr), free(y), free(dx2), free(dh2), free(db2);
	free(c.x), free(c.h), free(c.bias), free(c.g), free(c.y), free(dx), free(dh), free(db);
}

TEST_CASE(test_longconv)
{
	conv_case(2, 5, 3, true); /* finite differences of the direct twin */
	conv_case(1, 1, 3, true);
	static const int64_t Ts[] = {1, 2, 3, 7, 64, 97, 256, 1000};
	for (size_t i = 0; i < sizeof(Ts) / sizeof(Ts[0]); i++)
		conv_case(Ts[i] < 100 ? 3 : 1, Ts[i], 5, false);
	EXPECT(fftconv_size(1) == 1 && fftconv_size(2) == 3 && fftconv_size(7) == 15 &&
	           fftconv_size(1000) == 2000 && fftconv_size(256) == 512,
	       "fft sizes");
}

/* ------------------------------------------------------------ short conv */

struct sc_ctx {
	double *x, *w, *b, *g, *y;
	int64_t B, T, C, K;
};

static double sc_loss(void *p)
{
	struct sc_ctx *c = p;
	shortconv_forward_f64(c->y, c->x, c->w, c->b, c->B, c->T, c->C, c->K);
	return dot(c->y, c->g, c->B * c->T * c->C);
}

TEST_CASE(test_shortconv)
{
	int64_t B = 2, T = 6, C = 5, K = 3, n = B * T * C;
	struct sc_ctx c = {dalloc(n), dalloc(C * K), dalloc(C), dalloc(n), dalloc(n), B, T, C, K};
	test_fill(c.x, n, -1, 1);
	test_fill(c.w, C * K, -1, 1);
	test_fill(c.b, C, -1, 1);
	test_fill(c.g, n, -1, 1);
	sc_loss(&c);
	/* direct check of the definition at one point: t = 1 sees x[0], x[1] (taps 1, 2) */
	double want = c.b[2] + c.w[2 * K + 1] * c.x[0 * C + 2] + c.w[2 * K + 2] * c.x[1 * C + 2];
	EXPECT(fabs(c.y[1 * C + 2] - want) < 1e-14, "shortconv definition");
	double *dx = dalloc(n), *dw = dalloc(C * K), *db = dalloc(C);
	shortconv_backward_f64(dx, dw, db, c.g, c.x, c.w, B, T, C, K);
	fd_check("shortconv dx", c.x, n, sc_loss, &c, dx);
	fd_check("shortconv dw", c.w, C * K, sc_loss, &c, dw);
	fd_check("shortconv dbias", c.b, C, sc_loss, &c, db);
	float *xf = to_f32(c.x, n), *wf = to_f32(c.w, C * K), *bf = to_f32(c.b, C);
	float *yf = calloc((size_t)n, 4);
	shortconv_forward_f32(yf, xf, wf, bf, B, T, C, K);
	sc_loss(&c);
	EXPECT(rel_f32_f64(yf, c.y, n) < 1e-6, "shortconv f32");
	free(xf), free(wf), free(bf), free(yf);
	free(c.x), free(c.w), free(c.b), free(c.g), free(c.y), free(dx), free(dw), free(db);
}

/* ------------------------------------------------------------ layernorm */

struct ln_ctx {
	double *x, *w, *b, *g, *y, *mean, *rstd;
	int64_t N, C;
};

static double ln_loss(void *p)
{
	struct ln_ctx *c = p;
	layernorm_forward_f64(c->y, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C, 1e-5);
	return dot(c->y, c->g, c->N * c->C);
}

TEST_CASE(test_layernorm)
{
	int64_t N = 7, C = 13;
	struct ln_ctx c = {
	    dalloc(N * C), dalloc(C), dalloc(C), dalloc(N * C), dalloc(N * C), dalloc(N),
	    dalloc(N),     N,         C};
	test_fill(c.x, N * C, -2, 3);
	test_fill(c.w, C, 0.5, 1.5);
	test_fill(c.b, C, -1, 1);
	test_fill(c.g, N * C, -1, 1);
	ln_loss(&c);
	double *dx = dalloc(N * C), *dw = dalloc(C), *db = dalloc(C);
	layernorm_backward_f64(dx, dw, db, c.g, c.x, c.w, c.mean, c.rstd, N, C);
	fd_check("layernorm dx", c.x, N * C, ln_loss, &c, dx);
	fd_check("layernorm dw", c.w, C, ln_loss, &c, dw);
	fd_check("layernorm db", c.b, C, ln_loss, &c, db);
	float *xf = to_f32(c.x, N * C), *wf = to_f32(c.w, C), *bf = to_f32(c.b, C);
	float *yf = calloc((size_t)(N * C), 4), *mf = calloc((size_t)N, 4);
	float *rf = calloc((size_t)N, 4);
	layernorm_forward_f32(yf, mf, rf, xf, wf, bf, N, C, 1e-5);
	ln_loss(&c);
	EXPECT(rel_f32_f64(yf, c.y, N * C) < 1e-6, "layernorm f32");
	free(xf), free(wf), free(bf), free(yf), free(mf), free(rf);
	free(c.x), free(c.w), free(c.b), free(c.g), free(c.y), free(c.mean), free(c.rstd);
	free(dx), free(dw), free(db);
}

/* ------------------------------------------------------------ gelu, sin, bias */

struct ew_ctx {
	double *x, *f, *g, *y;
	int64_t N, C;
	int op; /* 0 gelu, 1 sin, 2 bias */
};

static double ew_loss(void *p)
{
	struct ew_ctx *c = p;
	int64_t n = c->N * c->C;
	if (c->op == 0) {
		gelu_forward_f64(c->y, c->x, n);
	} else if (c->op == 1) {
		sin_forward_f64(c->y, c->x, c->f, c->N, c->C);
	} else {
		memcpy(c->y, c->x, (size_t)n * sizeof(double));
		bias_forward_f64(c->y, c->f, c->N, c->C);
	}
	return dot(c->y, c->g, n);
}

TEST_CASE(test_elementwise)
{
	int64_t N = 9, C = 6, n = N * C;
	struct ew_ctx c = {dalloc(n), dalloc(C), dalloc(n), dalloc(n), N, C, 0};
	test_fill(c.x, n, -4, 4);
	test_fill(c.f, C, 0.5, 14);
	test_fill(c.g, n, -1, 1);
	double *dx = dalloc(n), *df = dalloc(C);
	/* gelu */
	gelu_backward_f64(dx, c.g, c.x, n);
	fd_check("gelu dx", c.x, n, ew_loss, &c, dx);
	ew_loss(&c);
	EXPECT(fabs(c.y[0] -
	            0.5 * c.x[0] *
	                (1 + tanh(sqrt(2 / M_PI) * (c.x[0] + 0.044715 * pow(c.x[0], 3))))) < 1e-15,
	       "gelu definition");
	float *xf = to_f32(c.x, n), *ff = to_f32(c.f, C), *yf = calloc((size_t)n, 4);
	gelu_forward_f32(yf, xf, n);
	EXPECT(rel_f32_f64(yf, c.y, n) < 1e-6, "gelu f32 %.3e", rel_f32_f64(yf, c.y, n));
	/* sin */
	c.op = 1;
	memset(dx, 0, (size_t)n * sizeof(double));
	sin_backward_f64(dx, df, c.g, c.x, c.f, N, C);
	fd_check("sin dx", c.x, n, ew_loss, &c, dx);
	fd_check("sin dfreq", c.f, C, ew_loss, &c, df);
	ew_loss(&c);
	sin_forward_f32(yf, xf, ff, N, C);
	EXPECT(rel_f32_f64(yf, c.y, n) < 1e-5, "sin f32");
	/* bias */
	c.op = 2;
	memset(df, 0, (size_t)C * sizeof(double));
	bias_backward_f64(df, c.g, N, C);
	fd_check("bias db", c.f, C, ew_loss, &c, df);
	free(xf), free(ff), free(yf);
	free(c.x), free(c.f), free(c.g), free(c.y), free(dx), free(df);
}

/* ------------------------------------------------------------ implicit filter */

struct filt_ctx {
	double *z, *win, *W0, *b0, *freq, *W1, *b1, *W2, *b2, *W3, *g, *h, *acts;
	int64_t L, E, F, C;
};

static double filt_loss(void *p)
{
	struct filt_ctx *c = p;
	hyena_filter_forward_f64(c->h, c->acts, c->z, c->win, c->W0, c->b0, c->freq, c->W1, c->b1,
	                         c->W2, c->b2, c->W3, c->L, c->E, c->F, c->C);
	return dot(c->h, c->g, c->L * c->C);
}

TEST_CASE(test_filter)
{
	int64_t L = 9, E = 5, F = 4, C = 6, lmax = 12;
	struct filt_ctx c = {dalloc(L * E),
	                     dalloc(L * C),
	                     dalloc(F * E),
	                     dalloc(F),
	                     dalloc(F),
	                     dalloc(F * F),
	                     dalloc(F),
	                     dalloc(F * F),
	                     dalloc(F),
	                     dalloc(C * F),
	                     dalloc(L * C),
	                     dalloc(L * C),
	                     dalloc(6 * L * F),
	                     L,
	                     E,
	                     F,
	                     C};
	hyena_filter_features_f64(c.z, c.win, L, lmax, E, C);
	/* features: t/(l_max-1), cos(f w), -sin(f w) with f = linspace(1e-4, B-1, B), B = 2 */
	double w3 = 2 * M_PI * 3 / (double)lmax;
	EXPECT(fabs(c.z[3 * E] - 3.0 / 11) < 1e-15 &&
	           fabs(c.z[3 * E + 1] - cos(1e-4 * w3)) < 1e-15 &&
	           fabs(c.z[3 * E + 2] - cos(w3)) < 1e-15 && fabs(c.z[3 * E + 4] + sin(w3)) < 1e-15,
	       "positional features");
	EXPECT(fabs(c.win[2 * C + C - 1] - exp(-2.0 / 11 * fabs(log(1e-2) / 0.3))) < 1e-15 &&
	           fabs(c.win[2 * C] - exp(-2.0 / 11 * fabs(log(1e-2) / 1.5))) < 1e-15,
	       "decay window");
	double *ps[] = {c.W0, c.b0, c.W1, c.b1, c.W2, c.b2, c.W3};
	int64_t ns[] = {F * E, F, F * F, F, F * F, F, C * F};
	for (int i = 0; i < 7; i++)
		test_fill(ps[i], ns[i], -1, 1);
	test_fill(c.freq, F, 0.5, 3);
	test_fill(c.g, L * C, -1, 1);
	filt_loss(&c);
	double *d[8];
	int64_t dn[8] = {F * E, F, F, F * F, F, F * F, F, C * F};
	for (int i = 0; i < 8; i++)
		d[i] = dalloc(dn[i]);
	double *scr = dalloc(L * (C + 2 * F));
	hyena_filter_backward_f64(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], c.g, c.acts, c.z,
	                          c.win, c.freq, c.W1, c.W2, c.W3, L, E, F, C, scr);
	double *px[8] = {c.W0, c.b0, c.freq, c.W1, c.b1, c.W2, c.b2, c.W3};
	const char *names[8] = {"W0", "b0", "freq", "W1", "b1", "W2", "b2", "W3"};
	for (int i = 0; i < 8; i++) {
		char what[32];
		snprintf(what, sizeof(what), "filter d%s", names[i]);
		fd_check(what, px[i], dn[i], filt_loss, &c, d[i]);
	}
	for (int i = 0; i < 8; i++)
		free(d[i]);
	free(scr);
	double **all[] = {&c.z,  &c.win, &c.W0, &c.b0, &c.freq, &c.W1,  &c.b1,
	                  &c.W2, &c.b2,  &c.W3, &c.g,  &c.h,    &c.acts};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(*all[i]);
}

int main(void)
{
	test_seed();
	RUN(test_longconv);
	RUN(test_shortconv);
	RUN(test_layernorm);
	RUN(test_elementwise);
	RUN(test_filter);
	return test_summary();
}
