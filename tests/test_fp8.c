/* tests/test_fp8: the fp8 formats (base/fp8.h) and the emulated float8 linear
 * (kernels/fp8_linear.h) against references written here from the definitions:
 *   - the value of every code from sign/exponent/mantissa (OCP FP8: e4m3fn without infinity,
 *     NaN = S.1111.111; e5m2 IEEE-like), and the round trip code -> float -> code of all 256;
 *   - casts: the nearest code by brute force over all codes (ties to the even code; the code
 *     just past the largest finite one stands for "overflow": NaN for e4m3fn, infinity for
 *     e5m2), on random floats of every magnitude and on edge values (ties between every two
 *     neighbours, subnormals, overflow thresholds, NaN, infinities, -0), plain and saturating;
 *   - scales: torchao's amax_to_scale (max / max(amax, 1e-12), optionally floored to 2^k);
 *   - each recipe's forward and both backward matmuls against float64 products of the same
 *     quantised operands (the emulated linear is straight-through: its gradients are those
 *     of the quantised product), with accumulation, and a prepared weight;
 *   - a token group (context parallelism): halves of the rows cast with the whole tensor's
 *     tensorwise scales once their amaxes are max-reduced, and equal one call on all rows.
 * Runs once per instruction set (CT_FP8_ISA, see tests/kernels.tests.cmake): every variant
 * must equal the reference bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp8.h"
#include "kernels/fp8_linear.h"
#include "kernels/mm_engine.h"
#include "testutil.h"

struct fmt_def {
	int mbits, bias, max_code;
};
static const struct fmt_def defs[FP8_FMT_COUNT] = {{3, 7, 0x7e}, {2, 15, 0x7b}};

/* The definition: value of code c, with the "virtual" code max_code + 1 given its value as if
 * the format continued (used only as the overflow candidate). */
static double ref_value(enum fp8_fmt f, int c, bool virt)
{
	const struct fmt_def *d = &defs[f];
	int eb = 7 - d->mbits, a = c & 0x7f;
	int e = (a >> d->mbits) & ((1 << eb) - 1), m = a & ((1 << d->mbits) - 1);
	double mant = (double)m / (double)(1 << d->mbits);
	double v = e ? ldexp(1.0 + mant, e - d->bias) : ldexp(mant, 1 - d->bias);
	if (!virt && a > d->max_code)
		v = (f == FP8_E5M2 && a == 0x7c) ? INFINITY : NAN;
	return (c & 0x80) ? -v : v;
}

static int ref_cast(float x, enum fp8_fmt f, bool saturate)
{
	const struct fmt_def *d = &defs[f];
	int s = signbit(x) ? 0x80 : 0;
	if (isnan(x))
		return s | 0x7f;
	double a = fabs((double)x), mx = ref_value(f, d->max_code, true);
	if (saturate && a > mx)
		a = mx;
	int best = 0;
	double bd = INFINITY;
	for (int c = 0; c <= d->max_code + 1; c++) {
		double dd = fabs(ref_value(f, c, true) - a);
		if (dd < bd || (dd == bd && (c & 1) == 0)) {
			bd = dd;
			best = c;
		}
	}
	if (a >= ref_value(f, d->max_code + 1, true)) /* beyond: no tie left to break */
		best = d->max_code + 1;
	return s | best; /* max_code + 1 is 0x7f (NaN) for e4m3fn and 0x7c (inf) for e5m2 */
}

static bool same_value(float a, double b)
{
	return (isnan(a) && isnan(b)) || (a == b && !signbit(a) == !signbit(b));
}

TEST_CASE(all_codes_decode_and_round_trip)
{
	for (int f = 0; f < FP8_FMT_COUNT; f++)
		for (int c = 0; c < 256; c++) {
			float v = fp8_to_f32((uint8_t)c, f);
			double r = ref_value(f, c, false);
			EXPECT(same_value(v, r), "%s code 0x%02x: %g, expected %g", fp8_fmt_name(f),
			       c, v, r);
			int back = fp8_from_f32(v, f);
			int want = isnan(r) ? ((c & 0x80) | 0x7f) : c;
			EXPECT(back == want, "%s code 0x%02x -> %g -> 0x%02x", fp8_fmt_name(f), c, v,
			       back);
			uint8_t q;
			fp8_quantize(&q, &v, 1, 1.0f, f);
			want = ref_cast(v, f, true); /* infinity saturates to the largest finite */
			EXPECT(q == want, "%s saturating round trip 0x%02x -> 0x%02x",
			       fp8_fmt_name(f), c, q);
		}
	EXPECT(fp8_max(FP8_E4M3) == 448.0f && fp8_max(FP8_E5M2) == 57344.0f, "max");
}

/* Checks the scalar cast and the array casts (plain values through the saturating path) of
 * xs[0..n) against the reference. */
static void check_casts(const float *xs, int64_t n, enum fp8_fmt f, int *bad)
{
	uint8_t *q = malloc((size_t)n);
	float *vals = malloc((size_t)n * 4), *ones = malloc((size_t)n * 4);
	for (int64_t i = 0; i < n; i++)
		ones[i] = 1.0f;
	fp8_quantize(q, xs, n, 1.0f, f);
	fp8_quantize_values(vals, xs, n, 1.0f, f);
	uint8_t *qv = malloc((size_t)n);
	fp8_quantize_vs(qv, xs, n, ones, f);
	for (int64_t i = 0; i < n; i++) {
		int plain = ref_cast(xs[i], f, false), sat = ref_cast(xs[i], f, true);
		int got = fp8_from_f32(xs[i], f);
		if (got != plain || q[i] != sat || qv[i] != sat ||
		    !same_value(vals[i], ref_value(f, sat, false))) {
			if ((*bad)++ < 8)
				EXPECT(0, "%s cast of %a: plain 0x%02x (want 0x%02x), saturating 0x%02x"
				          " / 0x%02x (want 0x%02x)",
				       fp8_fmt_name(f), (double)xs[i], got, plain, q[i], qv[i], sat);
		}
	}
	free(q), free(qv), free(vals), free(ones);
}

TEST_CASE(casts_edges_and_random)
{
	enum { NR = 20000 };
	for (int f = 0; f < FP8_FMT_COUNT; f++) {
		float xs[4096 + NR];
		int64_t n = 0;
		/* every code's value, the midpoints (ties) and a hair either side of them */
		for (int c = 0; c <= defs[f].max_code; c++) {
			double v = ref_value(f, c, true), w = ref_value(f, c + 1, true);
			double mid = 0.5 * (v + w);
			float cand[] = {(float)v, (float)mid, nextafterf((float)mid, 0.0f),
			                nextafterf((float)mid, INFINITY)};
			for (int k = 0; k < 4; k++) {
				xs[n++] = cand[k];
				xs[n++] = -cand[k];
			}
		}
		const float special[] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 1e30f,
		                         -1e30f, 3.4e38f, 1e-30f, -1e-30f, 1e-40f, -1e-40f,
		                         0x1p-126f, 464.0f, 465.0f, 480.0f, 61440.0f, 61439.0f,
		                         57344.0f, 0x1p-10f, 0x1p-17f, 0x1.8p-17f, 0x1p-16f};
		for (size_t k = 0; k < sizeof(special) / sizeof(special[0]); k++)
			xs[n++] = special[k];
		/* random floats: random sign, exponent in [-30, 20], random mantissa bits */
		for (int i = 0; i < NR; i++) {
			int e = (int)test_uniform(-30, 21);
			float m = (float)test_uniform(1.0, 2.0);
			xs[n++] = (test_uniform(0, 1) < 0.5 ? -1.0f : 1.0f) * ldexpf(m, e);
		}
		int bad = 0;
		check_casts(xs, n, (enum fp8_fmt)f, &bad);
		EXPECT(bad == 0, "%s: %d of %lld casts differ from the reference",
		       fp8_fmt_name(f), bad, (long long)n);
	}
	printf("  fp8 array casts ran with %s\n", fp8_isa());
}

TEST_CASE(scales_as_torchao)
{
	for (int i = 0; i < 1000; i++) {
		double amax = ldexp(test_uniform(1, 2), (int)test_uniform(-40, 40));
		for (int f = 0; f < FP8_FMT_COUNT; f++) {
			float s = fp8_scale_from_amax(amax, f, false);
			float want = (float)((double)fp8_max(f) / amax);
			EXPECT(s == want, "scale of amax %g: %g, want %g", amax, s, want);
			float p = fp8_scale_from_amax(amax, f, true);
			int k;
			EXPECT(frexpf(p, &k) == 0.5f && p <= want && 2.0f * p > want,
			       "pow2 scale of amax %g: %g (from %g)", amax, p, want);
		}
	}
	EXPECT(fp8_scale_from_amax(0.0, FP8_E4M3, false) == (float)(448.0 / 1e-12),
	       "amax 0 clamps to 1e-12");
	EXPECT(fp8_scale_from_amax(1e-13, FP8_E5M2, false) == (float)(57344.0 / 1e-12),
	       "amax below eps clamps");
}

/* ---- the linear ---- */

enum gran { T, R, Cc }; /* tensorwise, per row, per column */

/* The test's own quantisation of x (rows x cols) into dequantised doubles q/scale. */
static void ref_quant(double *out, const float *x, int64_t rows, int64_t cols, enum gran g,
                      enum fp8_fmt f, bool pow2)
{
	int64_t ns = g == T ? 1 : g == R ? rows : cols;
	double *amax = calloc((size_t)ns, sizeof(double));
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = 0; c < cols; c++) {
			int64_t k = g == T ? 0 : g == R ? r : c;
			amax[k] = fmax(amax[k], fabs((double)x[r * cols + c]));
		}
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = 0; c < cols; c++) {
			int64_t k = g == T ? 0 : g == R ? r : c;
			float s = (float)((double)fp8_max(f) / fmax(amax[k], 1e-12));
			if (pow2)
				s = (float)exp2(floor(log2((double)s)));
			int code = ref_cast(x[r * cols + c] * s, f, true);
			out[r * cols + c] = ref_value(f, code, false) / (double)s;
		}
	free(amax);
}

/* C(M,N) = op(A) op(B) in double, A: M x K (or K x M if ta), B: K x N (or N x K if tb). */
static void dmm(double *C, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double *A,
                const double *B)
{
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double s = 0;
			for (int64_t k = 0; k < K; k++)
				s += (ta ? A[k * M + i] : A[i * K + k]) *
				     (tb ? B[j * K + k] : B[k * N + j]);
			C[i * N + j] = s;
		}
}

static double rel_to(const float *got, const float *base, const double *want, int64_t n)
{
	double d = 0, r = 0;
	for (int64_t i = 0; i < n; i++) {
		double g = (double)got[i] - (double)base[i];
		d += (g - want[i]) * (g - want[i]);
		r += want[i] * want[i];
	}
	return sqrt(d / (r + 1e-300));
}

static void check_recipe(enum fp8_recipe rc, bool prepared)
{
	const int64_t N = 24, C = 40, OC = 36;
	float *x = malloc(N * C * 4), *w = malloc(OC * C * 4), *dy = malloc(N * OC * 4);
	float *y = malloc(N * OC * 4), *y0 = malloc(N * OC * 4), *dx = malloc(N * C * 4),
	      *dx0 = malloc(N * C * 4), *dw = malloc(OC * C * 4), *dw0 = malloc(OC * C * 4);
	double *qx = malloc(N * C * 8), *qw = malloc(OC * C * 8), *qd = malloc(N * OC * 8),
	       *qx2 = malloc(N * C * 8), *qd2 = malloc(N * OC * 8), *qw2 = malloc(OC * C * 8),
	       *ry = malloc(N * OC * 8), *rdx = malloc(N * C * 8), *rdw = malloc(OC * C * 8);
	/* spread magnitudes, so scales and subnormals matter */
	test_fill_f32(x, N * C, -3, 3);
	test_fill_f32(w, OC * C, -0.05, 0.05);
	test_fill_f32(dy, N * OC, -1e-3, 1e-3);
	for (int64_t i = 0; i < N * C; i += 7)
		x[i] *= 1e-3f;
	test_fill_f32(y0, N * OC, -1, 1);
	/* accumulators of the size of what is added, so the difference keeps its digits */
	test_fill_f32(dx0, N * C, -1e-4, 1e-4);
	test_fill_f32(dw0, OC * C, -1e-2, 1e-2);
	memcpy(y, y0, N * OC * 4), memcpy(dx, dx0, N * C * 4), memcpy(dw, dw0, OC * C * 4);

	fp8_linear_configure(true, rc, "");
	float *wq = w;
	float wq_buf[36 * 40];
	if (prepared) { /* a weight delivered as fp8 values with its tensorwise scale */
		float s = fp8_scale_from_amax(fp8_amax(w, OC * C), FP8_E4M3, false);
		fp8_quantize_values(wq_buf, w, OC * C, s, FP8_E4M3);
		fp8_linear_unit_set(0, wq_buf);
		fp8_linear_add(0, wq_buf, OC, C, NULL);
		fp8_linear_set_prepared(wq_buf, s);
		wq = wq_buf;
	}
	fp8_linear_forward(y, x, wq, N, C, OC, 1);
	fp8_linear_backward(dx, dw, dy, x, wq, N, C, OC, 1);
	/* dinp_acc 0 (matmul_backward_set) overwrites: garbage in, the product out */
	float *dxs = malloc(N * C * 4), *dxz = calloc((size_t)(N * C), 4);
	test_fill_f32(dxs, N * C, -7, 7);
	fp8_linear_backward(dxs, NULL, dy, x, wq, N, C, OC, 0);
	fp8_linear_backward(dxz, NULL, dy, x, wq, N, C, OC, 1);
	EXPECT(memcmp(dxs, dxz, (size_t)(N * C) * 4) == 0,
	       "%s: dinp_acc 0 must overwrite dinp", fp8_recipe_name(rc));
	free(dxs), free(dxz);
	fp8_linear_unit_clear(0);

	bool tw = rc == FP8_TENSORWISE, p2 = !tw;
	/* forward */
	ref_quant(qx, x, N, C, tw ? T : R, FP8_E4M3, p2);
	ref_quant(qw, w, OC, C, tw ? T : R, FP8_E4M3, p2);
	dmm(ry, false, true, N, OC, C, qx, qw);
	/* dx = dy w */
	ref_quant(qd, dy, N, OC, tw ? T : R, tw ? FP8_E5M2 : FP8_E4M3, p2);
	ref_quant(qw2, w, OC, C, rc == FP8_ROWWISE ? Cc : T, FP8_E4M3, p2);
	dmm(rdx, false, false, N, C, OC, qd, qw2);
	/* dw = dy^T x */
	if (rc == FP8_ROWWISE_GW_HP) {
		for (int64_t i = 0; i < N * OC; i++)
			qd2[i] = dy[i];
		for (int64_t i = 0; i < N * C; i++)
			qx2[i] = x[i];
	} else {
		ref_quant(qd2, dy, N, OC, tw ? T : Cc, tw ? FP8_E5M2 : FP8_E4M3, p2);
		ref_quant(qx2, x, N, C, tw ? T : Cc, FP8_E4M3, p2);
	}
	dmm(rdw, true, false, OC, C, N, qd2, qx2);
	double ey = rel_to(y, y0, ry, N * OC), ex = rel_to(dx, dx0, rdx, N * C),
	       ew = rel_to(dw, dw0, rdw, OC * C);
	printf("  %-18s%s: rel. error y %.2e, dx %.2e, dw %.2e\n", fp8_recipe_name(rc),
	       prepared ? " (prepared w)" : "", ey, ex, ew);
	EXPECT(ey < 1e-5 && ex < 1e-5 && ew < 1e-5,
	       "%s: the emulated linear is not the product of the quantised operands "
	       "(y %.2e, dx %.2e, dw %.2e)",
	       fp8_recipe_name(rc), ey, ex, ew);
	/* and it is not the unquantised product: the casts happened */
	double *fx = malloc(N * C * 8), *fw = malloc(OC * C * 8);
	for (int64_t i = 0; i < N * C; i++)
		fx[i] = x[i];
	for (int64_t i = 0; i < OC * C; i++)
		fw[i] = w[i];
	dmm(ry, false, true, N, OC, C, fx, fw);
	double eu = rel_to(y, y0, ry, N * OC);
	EXPECT(eu > 1e-3 && eu < 0.2, "%s: distance from the unquantised product %.2e",
	       fp8_recipe_name(rc), eu);
	fp8_linear_configure(false, FP8_TENSORWISE, "");
	free(fx), free(fw);
	free(x), free(w), free(dy), free(y), free(y0), free(dx), free(dx0), free(dw), free(dw0);
	free(qx), free(qw), free(qd), free(qx2), free(qd2), free(qw2), free(ry), free(rdx), free(rdw);
}

TEST_CASE(linear_recipes_are_products_of_quantised_operands)
{
	for (int dt = 0; dt < MM_DTYPE_COUNT; dt++) {
		mm_engine_configure(MM_ENGINE_ONEDNN, (enum mm_dtype)dt);
		for (int r = 0; r < FP8_RECIPE_COUNT; r++) {
			/* high-precision dw under bf16 compute is a bf16 product: skip that one */
			if (dt == MM_BF16 && r == FP8_ROWWISE_GW_HP)
				continue;
			check_recipe((enum fp8_recipe)r, false);
		}
	}
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_F32);
	check_recipe(FP8_TENSORWISE, true);
}

/* A token group in one process (context parallelism's cp ranks, each holding some of the
 * micro-batch's tokens): "rank" h runs the linear on its half of the rows, and its token
 * group's max (fp8_slice.tok_max_f32) gives back the maximum with what the other half passed
 * at the same call, recorded in a first pass. Every half then casts with the whole tensor's
 * scales: its rows of y and dx are those of one call on all the rows, and the two halves'
 * weight gradients sum to the whole one's. Tensorwise asks for the amaxes of x (forward), dy
 * and x (backward); rowwise for the per-column amaxes of dy and x of its weight gradient. Its
 * scales are powers of two, and e4m3 rounds x 2^k exactly as x except below the normal range,
 * so only a half whose values the whole tensor's scale pushes into e4m3's subnormals (`shrink`
 * 1e-5: ~2^-17 of the other half's) casts differently with its own scales. */
#define TOK_CALLS 8
#define TOK_MAXN  64
struct tok_fake {
	float rec[2][TOK_CALLS][TOK_MAXN];
	int n[2], half;
	bool replay;
};

static void tok_fake_max(void *ctx, float *buf, int64_t n)
{
	struct tok_fake *t = ctx;
	int k = t->n[t->half]++;
	if (n > TOK_MAXN || k >= TOK_CALLS) /* the counts are checked */
		return;
	for (int64_t i = 0; i < n; i++) {
		if (t->replay)
			buf[i] = fmaxf(buf[i], t->rec[1 - t->half][k][i]);
		else
			t->rec[t->half][k][i] = buf[i];
	}
}

static void check_token_group(enum fp8_recipe recipe, int calls, float shrink)
{
	const int64_t N = 24, H = N / 2, C = 40, OC = 36;
	float *x = malloc(N * C * 4), *w = malloc(OC * C * 4), *dy = malloc(N * OC * 4);
	float *y = calloc(N * OC, 4), *dx = calloc(N * C, 4), *dw = calloc(OC * C, 4);
	float *yh = calloc(N * OC, 4), *dxh = calloc(N * C, 4), *dwh = calloc(OC * C, 4);
	test_fill_f32(x, N * C, -3, 3);
	test_fill_f32(w, OC * C, -0.05, 0.05);
	test_fill_f32(dy, N * OC, -1e-3, 1e-3);
	for (int64_t i = H * C; i < N * C; i++) /* the halves' amaxes differ */
		x[i] *= shrink;
	for (int64_t i = 0; i < H * OC; i++)
		dy[i] *= shrink;
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_F32);
	fp8_linear_configure(true, recipe, "");
	fp8_linear_unit_set(0, w);
	fp8_linear_add(0, w, OC, C, NULL);
	fp8_linear_forward(y, x, w, N, C, OC, 0);
	fp8_linear_backward(dx, dw, dy, x, w, N, C, OC, 0);
	fp8_linear_unit_clear(0);
	struct tok_fake t = {0};
	const struct fp8_slice sl = {.dim = -1, .tok_max_f32 = tok_fake_max, .tok_ctx = &t};
	fp8_linear_unit_set(0, w);
	fp8_linear_add(0, w, OC, C, &sl);
	double e_local = 0;
	for (int pass = 0; pass < 2; pass++) {
		t.replay = pass == 1;
		t.n[0] = t.n[1] = 0;
		memset(dwh, 0, OC * C * 4);
		for (int h = 0; h < 2; h++) {
			t.half = h;
			fp8_linear_forward(yh + h * H * OC, x + h * H * C, w, H, C, OC, 0);
			fp8_linear_backward(dxh + h * H * C, dwh, dy + h * H * OC, x + h * H * C, w, H, C,
			                    OC, 0);
		}
		EXPECT(t.n[0] == calls && t.n[1] == calls, "%s: token group asked %d/%d times, not %d",
		       fp8_recipe_name(recipe), t.n[0], t.n[1], calls);
		double ey = 0, ex = 0, ew = 0, ry = 0, rx = 0, rw = 0;
		for (int64_t i = 0; i < N * OC; i++)
			ey += (yh[i] - y[i]) * (double)(yh[i] - y[i]), ry += y[i] * (double)y[i];
		for (int64_t i = 0; i < N * C; i++)
			ex += (dxh[i] - dx[i]) * (double)(dxh[i] - dx[i]), rx += dx[i] * (double)dx[i];
		for (int64_t i = 0; i < OC * C; i++)
			ew += (dwh[i] - dw[i]) * (double)(dwh[i] - dw[i]), rw += dw[i] * (double)dw[i];
		ey = sqrt(ey / ry), ex = sqrt(ex / rx), ew = sqrt(ew / rw);
		printf("  %s, token group %s: rel. difference y %.2e, dx %.2e, dw %.2e\n",
		       fp8_recipe_name(recipe), pass ? "max-reduced" : "local only ", ey, ex, ew);
		if (pass == 0)
			e_local = fmax(ey, fmax(ex, ew));
		else /* the same fp8 values and scales; dw only sums in another order */
			EXPECT(ey < 1e-6 && ex < 1e-6 && ew < 1e-6,
			       "%s token group: halves differ from the whole (y %.2e, dx %.2e, dw %.2e)",
			       fp8_recipe_name(recipe), ey, ex, ew);
	}
	EXPECT(e_local > 1e-4, "%s token group: the halves' own scales should differ (%.2e)",
	       fp8_recipe_name(recipe), e_local);
	fp8_linear_unit_clear(0);
	fp8_linear_configure(false, FP8_TENSORWISE, "");
	free(x), free(w), free(dy), free(y), free(dx), free(dw), free(yh), free(dxh), free(dwh);
}

TEST_CASE(token_group_max_gives_one_rank_scales)
{
	check_token_group(FP8_TENSORWISE, 3, 0.3f);
	check_token_group(FP8_ROWWISE, 2, 1e-5f);
}

TEST_CASE(filter_and_recipe_names)
{
	fp8_linear_configure(true, FP8_ROWWISE, "output,wk");
	EXPECT(!fp8_linear_wants("output.weight"), "output filtered");
	EXPECT(!fp8_linear_wants("layers.1.attention.wk.weight"), "wk filtered");
	EXPECT(fp8_linear_wants("layers.1.attention.wq.weight"), "wq converted");
	fp8_linear_configure(false, FP8_ROWWISE, "");
	EXPECT(!fp8_linear_wants("layers.1.attention.wq.weight"), "off");
	enum fp8_recipe r;
	EXPECT(fp8_recipe_parse("rowwise_with_gw_hp", &r) == 0 && r == FP8_ROWWISE_GW_HP, "name");
	EXPECT(fp8_recipe_parse("rowwise_gw", &r) == -1, "unknown name");
}

int main(void)
{
	test_seed();
	RUN(all_codes_decode_and_round_trip);
	RUN(casts_edges_and_random);
	RUN(scales_as_torchao);
	RUN(linear_recipes_are_products_of_quantised_operands);
	RUN(token_group_max_gives_one_rank_scales);
	RUN(filter_and_recipe_names);
	return test_summary();
}
