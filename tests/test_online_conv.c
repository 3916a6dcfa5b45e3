/* tests/test_online_conv: every mode of infer/online_conv against a long-double direct sum.
 *
 * Inputs are genuinely online: each next input depends on the outputs just produced
 * (contractive feedback y[t+1] = u[t] + 0.5 tanh(z[t])), and order-3 chains feed each
 * convolution's output through a gate into the next one at the same position. The
 * reference is the direct sum z*[t] = sum_k rho[t-k] y[k] in long double over the inputs the
 * engine actually saw, so errors cannot hide in the feedback. Metric (notes/flash_inference.md
 * section 8): e = max_t |z[t] - z*[t]| / sum_k |rho[t-k] y[k]|; a correctly rounded method
 * gets e of a few ulps times log L. Bounds: 1e-12 in fp64 (measured ~1e-16) and 2e-5 in fp32
 * (measured ~1e-7); a missed or doubled tile gives e of order 1e-2..1.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/online_conv.h"
#include "testutil.h"

/* One engine of either precision, driven through double arrays. */
struct eng {
	bool f64;
	struct oc_engine_f32 *e32;
	struct oc_engine_f64 *e64;
	float *t32, *u32; /* conversion buffers */
};

static void eng_create(struct eng *e, bool f64, const struct oc_config *cfg, const double *rho)
{
	memset(e, 0, sizeof(*e));
	e->f64 = f64;
	int64_t nr = cfg->nconv * cfg->C * cfg->L,
	        nio = cfg->B * (cfg->P > 1 ? cfg->P : 1) * cfg->C;
	if (f64) {
		e->e64 = oc_create_f64(cfg, rho);
		return;
	}
	float *r32 = malloc((size_t)nr * sizeof(float));
	for (int64_t i = 0; i < nr; i++)
		r32[i] = (float)rho[i];
	e->e32 = oc_create_f32(cfg, r32);
	free(r32);
	e->t32 = malloc((size_t)nio * sizeof(float));
	e->u32 = malloc((size_t)nio * sizeof(float));
}

static void eng_free(struct eng *e)
{
	oc_free_f32(e->e32);
	oc_free_f64(e->e64);
	free(e->t32), free(e->u32);
}

static void eng_prompt(struct eng *e, int64_t conv, const double *y, double *z, int64_t n)
{
	if (e->f64)
		return oc_prompt_f64(e->e64, conv, y, z);
	for (int64_t i = 0; i < n; i++)
		e->t32[i] = (float)y[i];
	oc_prompt_f32(e->e32, conv, e->t32, e->u32);
	for (int64_t i = 0; i < n; i++)
		z[i] = e->u32[i];
}

static void eng_red(struct eng *e, int64_t conv, const double *y, double *z, int64_t n)
{
	if (e->f64)
		return oc_red_f64(e->e64, conv, y, z);
	for (int64_t i = 0; i < n; i++)
		e->t32[i] = (float)y[i];
	oc_red_f32(e->e32, conv, e->t32, e->u32);
	for (int64_t i = 0; i < n; i++)
		z[i] = e->u32[i];
}

static void eng_tiles(struct eng *e)
{
	if (e->f64)
		oc_tiles_f64(e->e64);
	else
		oc_tiles_f32(e->e32);
}

/* Positions checked against the reference: all of them for small L, else a sample that
 * contains the first 1024, every power of two +-1, the last 64 and 256 random ones. */
static bool *check_mask(int64_t L)
{
	bool *m = calloc((size_t)L, 1);
	if (L <= 4096) {
		memset(m, 1, (size_t)L);
		return m;
	}
	for (int64_t t = 0; t < 1024; t++)
		m[t] = true;
	for (int64_t p = 1; p < L; p *= 2)
		for (int64_t d = -1; d <= 1; d++)
			if (p + d >= 0 && p + d < L)
				m[p + d] = true;
	for (int64_t t = L - 64; t < L; t++)
		m[t] = true;
	for (int i = 0; i < 256; i++)
		m[(int64_t)test_uniform(0, (double)L)] = true;
	return m;
}

/* Runs nconv chained convolutions (one layer of an order nconv+1 operator) over L positions
 * with a prompt of P, returns the normalised error against the long-double reference. */
static double run_case(bool f64, enum oc_mode mode, int64_t L, int64_t P, int64_t B, int64_t C,
                       int64_t nconv, int64_t thr)
{
	struct oc_config cfg = {
	    .nconv = nconv, .B = B, .C = C, .L = L, .P = P, .mode = mode, .thr = thr};
	const int64_t BC = B * C;
	double *rho = malloc((size_t)(nconv * C * L) * sizeof(double));
	/* filters: random taps with a slow decay, like a trained Hyena filter */
	for (int64_t i = 0; i < nconv * C; i++)
		for (int64_t m = 0; m < L; m++)
			rho[i * L + m] =
			    test_uniform(-1, 1) / sqrt(1.0 + (double)m * 16.0 / (double)L);
	/* recorded inputs and outputs, (nconv, B, C, L) */
	double *Y = calloc((size_t)(nconv * BC * L), sizeof(double));
	double *Z = calloc((size_t)(nconv * BC * L), sizeof(double));
	int64_t np = P > 1 ? P : 1;
	double *yio = malloc((size_t)(B * np * C) * sizeof(double));
	double *zio = malloc((size_t)(B * np * C) * sizeof(double));
	double *feed = malloc((size_t)BC * sizeof(double));
	struct eng e;
	eng_create(&e, f64, &cfg, rho);
#define ROUND(v)       (f64 ? (v) : (double)(float)(v))
#define AT(o, b, c, t) ((((o)*B + (b)) * C + (c)) * L + (t))
	/* prompt: random inputs to the first conv, gated outputs into the next */
	if (P > 0) {
		for (int64_t i = 0; i < B * P * C; i++)
			yio[i] = ROUND(test_uniform(-1, 1));
		for (int64_t o = 0; o < nconv; o++) {
			eng_prompt(&e, o, yio, zio, B * P * C);
			for (int64_t b = 0; b < B; b++)
				for (int64_t p = 0; p < P; p++)
					for (int64_t c = 0; c < C; c++) {
						int64_t i = (b * P + p) * C + c;
						Y[AT(o, b, c, p)] = yio[i];
						Z[AT(o, b, c, p)] = zio[i];
						yio[i] = ROUND(0.3 * yio[i] + 0.5 * tanh(zio[i]));
					}
		}
		for (int64_t b = 0; b < B; b++)
			for (int64_t c = 0; c < C; c++)
				feed[b * C + c] = 0.5 * tanh(Z[AT(nconv - 1, b, c, P - 1)]);
	} else {
		for (int64_t i = 0; i < BC; i++)
			feed[i] = 0;
	}
	/* generation: y[t] = u + feedback of the last output at t-1 */
	for (int64_t t = P; t < L; t++) {
		for (int64_t i = 0; i < BC; i++)
			yio[i] = ROUND(test_uniform(-0.5, 0.5) + feed[i]);
		for (int64_t o = 0; o < nconv; o++) {
			eng_red(&e, o, yio, zio, BC);
			for (int64_t b = 0; b < B; b++)
				for (int64_t c = 0; c < C; c++) {
					int64_t i = b * C + c;
					Y[AT(o, b, c, t)] = yio[i];
					Z[AT(o, b, c, t)] = zio[i];
					yio[i] = ROUND(0.3 * yio[i] + 0.5 * tanh(zio[i]));
				}
		}
		for (int64_t i = 0; i < BC; i++)
			feed[i] = 0.5 * tanh(zio[i]);
		eng_tiles(&e);
	}
	/* the reference over what the engine saw */
	bool *mask = check_mask(L);
	double err = 0;
	for (int64_t o = 0; o < nconv; o++)
		for (int64_t b = 0; b < B; b++)
			for (int64_t c = 0; c < C; c++) {
				const double *r = rho + (o * C + c) * L;
				const double *y = Y + AT(o, b, c, 0);
				for (int64_t t = 0; t < L; t++) {
					if (!mask[t])
						continue;
					long double s = 0, d = 0;
					for (int64_t k = 0; k <= t; k++) {
						long double v =
						    (long double)r[t - k] * (long double)y[k];
						s += v;
						d += fabsl(v);
					}
					double ek =
					    (double)(fabsl((long double)Z[AT(o, b, c, t)] - s) /
					             (d > 0 ? d : 1e-300L));
					if (!(ek <= err)) /* NaN propagates */
						err = ek;
				}
			}
#undef AT
#undef ROUND
	eng_free(&e);
	free(mask), free(rho), free(Y), free(Z), free(yio), free(zio), free(feed);
	return err;
}

static void check(bool f64, enum oc_mode mode, int64_t L, int64_t P, int64_t B, int64_t C,
                  int64_t nconv, int64_t thr)
{
	double tol = f64 ? 1e-12 : 2e-5;
	double e = run_case(f64, mode, L, P, B, C, nconv, thr);
	EXPECT(e <= tol, "%s %s L=%lld P=%lld B=%lld C=%lld chain=%lld thr=%lld: error %.3g > %.0e",
	       f64 ? "fp64" : "fp32", oc_mode_name(mode), (long long)L, (long long)P, (long long)B,
	       (long long)C, (long long)nconv, (long long)thr, e, tol);
	if (getenv("CT_VERBOSE"))
		fprintf(stderr, "  %s %-9s L=%-6lld P=%-4lld thr=%-6lld chain=%lld e=%.3g\n",
		        f64 ? "fp64" : "fp32", oc_mode_name(mode), (long long)L, (long long)P,
		        (long long)thr, (long long)nconv, e);
}

static const int64_t small_L[] = {1, 2, 3, 1000};

/* prompt lengths 0, 1, odd, 2^k, 2^k+1 that fit in L */
static const int64_t prompts[] = {0, 1, 37, 256, 257};

static void flash_small(bool f64)
{
	for (size_t i = 0; i < sizeof(small_L) / sizeof(small_L[0]); i++)
		for (size_t j = 0; j < sizeof(prompts) / sizeof(prompts[0]); j++) {
			int64_t L = small_L[i], P = prompts[j];
			if (P > L)
				continue;
			const int64_t thrs[] = {0, 16, L};
			for (int k = 0; k < 3; k++)
				check(f64, OC_FLASH, L, P, 2, 3, 2, thrs[k]);
		}
}

TEST_CASE(flash_fp64_small)
{
	flash_small(true);
}
TEST_CASE(flash_fp32_small)
{
	flash_small(false);
}

/* L = 2^16: all-FFT and the hybrid with a prompt of 2^k+1; all-direct (THR = L) on one
 * channel only (it is quadratic) */
TEST_CASE(flash_fp64_64k)
{
	const int64_t L = 1 << 16;
	check(true, OC_FLASH, L, 0, 1, 2, 2, 0);
	check(true, OC_FLASH, L, 4097, 2, 1, 1, 32);
	check(true, OC_FLASH, L, 1, 1, 1, 1, L);
}

TEST_CASE(flash_fp32_64k)
{
	const int64_t L = 1 << 16;
	check(false, OC_FLASH, L, 0, 1, 2, 1, 0);
	check(false, OC_FLASH, L, 257, 1, 1, 2, 16);
}

static void baselines(bool f64)
{
	const enum oc_mode modes[] = {OC_LAZY, OC_EAGER, OC_RECOMPUTE};
	for (int m = 0; m < 3; m++)
		for (size_t i = 0; i < sizeof(small_L) / sizeof(small_L[0]); i++)
			for (size_t j = 0; j < sizeof(prompts) / sizeof(prompts[0]); j++) {
				int64_t L = small_L[i], P = prompts[j];
				if (P <= L)
					check(f64, modes[m], L, P, 2, 2, 2, 0);
			}
}

TEST_CASE(baselines_fp64)
{
	baselines(true);
}
TEST_CASE(baselines_fp32)
{
	baselines(false);
}

/* The test must be able to fail: a filter change after creation (here: a different tap in
 * the reference) must be detected far above the bound. */
TEST_CASE(detects_wrong_result)
{
	const int64_t L = 64;
	struct oc_config cfg = {.nconv = 1, .B = 1, .C = 1, .L = L, .mode = OC_FLASH};
	double rho[64], rho2[64], y[64], z[64];
	for (int64_t m = 0; m < L; m++)
		rho[m] = rho2[m] = test_uniform(-1, 1);
	rho2[37] += 1e-6;
	struct oc_engine_f64 *e = oc_create_f64(&cfg, rho);
	for (int64_t t = 0; t < L; t++) {
		y[t] = test_uniform(-1, 1);
		oc_red_f64(e, 0, &y[t], &z[t]);
		oc_tiles_f64(e);
	}
	oc_free_f64(e);
	double err = 0;
	for (int64_t t = 0; t < L; t++) {
		long double s = 0, d = 0;
		for (int64_t k = 0; k <= t; k++) {
			s += (long double)rho2[t - k] * y[k];
			d += fabsl((long double)rho2[t - k] * y[k]);
		}
		err = fmax(err, (double)(fabsl(z[t] - s) / d));
	}
	EXPECT(err > 1e-12, "a perturbed filter tap went unnoticed (error %.3g)", err);
}

int main(void)
{
	test_seed();
	RUN(flash_fp64_small);
	RUN(flash_fp32_small);
	RUN(baselines_fp64);
	RUN(baselines_fp32);
	RUN(flash_fp64_64k);
	RUN(flash_fp32_64k);
	RUN(detects_wrong_result);
	return test_summary();
}
