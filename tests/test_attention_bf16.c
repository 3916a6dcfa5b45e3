/* Tests of the bf16 attention kernel (src/kernels/attention_bf16.c) against the float64
 * kernels (themselves tested against a naive reference and finite differences in
 * test_attention / test_attention_pos), on fresh random inputs:
 *   - causal forward (out, lse) and backward (dq, dk, dv, accumulated into random values);
 *   - the position-aware entries: a head-tail query shard against keys in another order, a
 *     block of keys that some queries do not see at all (lse -inf, out 0);
 *   - the same bits with 1 and 2 threads; CT_ATTENTION=f32 turns it off; attention_mixed_*
 *     runs it only under bf16 compute;
 *   - the softmax tiles' exponential against exp in double (it must be far more accurate than
 *     bf16: the end-to-end bounds below would not see an error of 1e-3).
 * Skipped (77) on a CPU without AVX512-BF16.
 *
 * Tolerances, from the format: bf16 keeps 8 significant bits, so each rounding moves a value
 * by at most u = 2^-9 relative. The forward rounds q, k, v and p (each product term carries
 * about 3u: q and k through the score, p, v), the backward also dout and ds (ds = p (dp - D)
 * carries p's, dp's and its own rounding, ~5u, and dq/dk multiply it by a rounded q or k).
 * The errors are independent across the summed terms, so the norm-wise error is below these
 * worst-case sums: bounds 4u (out, normwise over all elements) and 8u (gradients). lse is
 * checked element by element, absolute: its error is a p-weighted mean of the scores' errors,
 * each at most 2u sum_d |q_d k_d| / sqrt(D) (36u for these inputs at D = 64); q's roundings are
 * shared by all of a row's scores, so they do not average out over keys: up to 3.1u seen over
 * 25 seeds: bound 16u (a wrong mask or scale moves lse by O(1)). The fp32 kernel's errors on the same inputs are
 * ~1e-7; the bf16 errors must exceed 1e-5, or the bf16 path did not run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_bf16.h"
#include "kernels/kernels.h"
#include "kernels/mm_engine.h"
#include "testutil.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static const double U = 1.0 / 512; /* 2^-9 */

struct prob {
	int64_t B, Tq, Tk, H, KV, D, nq, nk, nl;
	double *q, *k, *v, *g, *out, *lse, *dq, *dk, *dv;   /* f64 reference */
	float *qf, *kf, *vf, *gf, *of, *lf, *dqf, *dkf, *dvf; /* bf16 kernel */
	double *base;                                        /* random initial gradients */
	int64_t *qpos, *kpos;
};

static double *dal(int64_t n)
{
	double *p = calloc((size_t)n, sizeof(double));
	if (!p)
		abort();
	return p;
}
static float *fal(int64_t n)
{
	float *p = calloc((size_t)n, sizeof(float));
	if (!p)
		abort();
	return p;
}
static void to_f32(float *d, const double *s, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		d[i] = (float)s[i];
}
static double rel_fd(const float *a, const double *b, int64_t n)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < n; i++) {
		num += (a[i] - b[i]) * (a[i] - b[i]);
		den += b[i] * b[i];
	}
	return sqrt(num / (den > 1e-300 ? den : 1e-300));
}

static struct prob prob_make(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                             int64_t D)
{
	struct prob p = {.B = B, .Tq = Tq, .Tk = Tk, .H = H, .KV = KV, .D = D};
	p.nq = B * Tq * H * D, p.nk = B * Tk * KV * D, p.nl = B * H * Tq;
	p.q = dal(p.nq), p.k = dal(p.nk), p.v = dal(p.nk), p.g = dal(p.nq);
	p.out = dal(p.nq), p.lse = dal(p.nl);
	p.dq = dal(p.nq), p.dk = dal(p.nk), p.dv = dal(p.nk);
	p.base = dal(p.nq + 2 * p.nk);
	test_fill(p.q, p.nq, -1.5, 1.5);
	test_fill(p.k, p.nk, -1.5, 1.5);
	test_fill(p.v, p.nk, -1, 1);
	test_fill(p.g, p.nq, -1, 1);
	test_fill(p.base, p.nq + 2 * p.nk, -0.1, 0.1);
	memcpy(p.dq, p.base, (size_t)p.nq * 8);
	memcpy(p.dk, p.base + p.nq, (size_t)p.nk * 8);
	memcpy(p.dv, p.base + p.nq + p.nk, (size_t)p.nk * 8);
	p.qf = fal(p.nq), p.kf = fal(p.nk), p.vf = fal(p.nk), p.gf = fal(p.nq);
	p.of = fal(p.nq), p.lf = fal(p.nl), p.dqf = fal(p.nq), p.dkf = fal(p.nk), p.dvf = fal(p.nk);
	to_f32(p.qf, p.q, p.nq), to_f32(p.kf, p.k, p.nk), to_f32(p.vf, p.v, p.nk);
	to_f32(p.gf, p.g, p.nq);
	to_f32(p.dqf, p.dq, p.nq), to_f32(p.dkf, p.dk, p.nk), to_f32(p.dvf, p.dv, p.nk);
	p.qpos = calloc((size_t)Tq, sizeof(int64_t));
	p.kpos = calloc((size_t)Tk, sizeof(int64_t));
	return p;
}

static void prob_free(struct prob *p)
{
	free(p->q), free(p->k), free(p->v), free(p->g), free(p->out), free(p->lse);
	free(p->dq), free(p->dk), free(p->dv), free(p->base), free(p->qpos), free(p->kpos);
	free(p->qf), free(p->kf), free(p->vf), free(p->gf), free(p->of), free(p->lf);
	free(p->dqf), free(p->dkf), free(p->dvf);
}

/* Reference and bf16 runs; pos: the position-aware entries (else plain causal, Tq == Tk). */
static void prob_run(struct prob *p, bool pos)
{
	const int64_t B = p->B, Tq = p->Tq, Tk = p->Tk, H = p->H, KV = p->KV, D = p->D;
	if (pos) {
		attention_pos_forward_f64(p->out, p->lse, p->q, p->qpos, p->k, p->v, p->kpos, B, Tq,
		                          Tk, H, KV, D);
		attention_pos_backward_f64(p->dq, p->dk, p->dv, p->g, p->out, p->lse, p->q, p->qpos,
		                           p->k, p->v, p->kpos, B, Tq, Tk, H, KV, D);
		attention_bf16_pos_forward(p->of, p->lf, p->qf, p->qpos, p->kf, p->vf, p->kpos, B, Tq,
		                           Tk, H, KV, D);
		attention_bf16_pos_backward(p->dqf, p->dkf, p->dvf, p->gf, p->of, p->lf, p->qf,
		                            p->qpos, p->kf, p->vf, p->kpos, B, Tq, Tk, H, KV, D);
	} else {
		attention_forward_f64(p->out, p->lse, p->q, p->k, p->v, B, Tq, H, KV, D);
		attention_backward_f64(p->dq, p->dk, p->dv, p->g, p->out, p->lse, p->q, p->k, p->v, B,
		                       Tq, H, KV, D);
		attention_bf16_forward(p->of, p->lf, p->qf, p->kf, p->vf, B, Tq, H, KV, D);
		attention_bf16_backward(p->dqf, p->dkf, p->dvf, p->gf, p->of, p->lf, p->qf, p->kf,
		                        p->vf, B, Tq, H, KV, D);
	}
}

/* The gradients' increments (accumulated into base) against the reference's. */
static double grad_err(const float *got, const double *ref, const double *base, int64_t n)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < n; i++) {
		double a = got[i] - base[i], b = ref[i] - base[i];
		num += (a - b) * (a - b);
		den += b * b;
	}
	return sqrt(num / (den > 1e-300 ? den : 1e-300));
}

static void prob_check(const struct prob *p, const char *what)
{
	double eo = rel_fd(p->of, p->out, p->nq), el = 0;
	int64_t inf_ok = 1;
	for (int64_t i = 0; i < p->nl; i++) {
		if (isinf(p->lse[i])) {
			inf_ok &= isinf(p->lf[i]) && p->lf[i] < 0;
			continue;
		}
		double e = fabs(p->lf[i] - p->lse[i]);
		el = e > el ? e : el;
	}
	double eq = grad_err(p->dqf, p->dq, p->base, p->nq);
	double ek = grad_err(p->dkf, p->dk, p->base + p->nq, p->nk);
	double ev = grad_err(p->dvf, p->dv, p->base + p->nq + p->nk, p->nk);
	printf("  %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e (bounds %.2e, %.2e, %.2e)\n", what,
	       eo, el, eq, ek, ev, 4 * U, 16 * U, 8 * U);
	EXPECT(eo < 4 * U && el < 16 * U, "%s: forward errors out %.3g lse %.3g", what, eo, el);
	EXPECT(eq < 8 * U && ek < 8 * U && ev < 8 * U, "%s: gradient errors %.3g %.3g %.3g", what,
	       eq, ek, ev);
	EXPECT(inf_ok, "%s: a query that sees no key must get lse -inf", what);
	EXPECT(eo > 1e-5 && eq > 1e-5, "%s: errors %.3g %.3g at fp32 level: bf16 did not run", what,
	       eo, eq);
}

TEST_CASE(causal_shapes)
{
	const int64_t shapes[][5] = {
	    {2, 150, 4, 2, 64}, {1, 64, 2, 1, 16}, {2, 200, 6, 2, 32}, {1, 130, 4, 4, 48},
	    {1, 257, 8, 2, 64}};
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int64_t *x = shapes[s];
		struct prob p = prob_make(x[0], x[1], x[1], x[2], x[3], x[4]);
		prob_run(&p, false);
		char what[96];
		snprintf(what, sizeof(what), "B=%lld T=%lld H=%lld KV=%lld D=%lld", (long long)x[0],
		         (long long)x[1], (long long)x[2], (long long)x[3], (long long)x[4]);
		prob_check(&p, what);
		prob_free(&p);
	}
}

/* Rank 1 of cp = 2 in head-tail order (chunks 1 and 2 of 4) against keys held in another
 * order, and against a key block of late positions only (early queries see none of it). */
TEST_CASE(positions)
{
	const int64_t T = 256, cp = 2, C = T / (2 * cp), Tq = T / cp;
	struct prob p = prob_make(2, Tq, T, 4, 2, 32);
	for (int64_t i = 0; i < C; i++) {
		p.qpos[i] = C + i;                      /* chunk 1 */
		p.qpos[C + i] = (2 * cp - 2) * C + i;   /* chunk 2 */
	}
	for (int64_t j = 0; j < T; j++)
		p.kpos[j] = (j * 37) % T; /* every position once, shuffled */
	prob_run(&p, true);
	prob_check(&p, "head-tail shard, shuffled keys");
	prob_free(&p);

	struct prob r = prob_make(1, 100, 70, 2, 1, 16);
	for (int64_t i = 0; i < 100; i++)
		r.qpos[i] = i;
	for (int64_t j = 0; j < 70; j++)
		r.kpos[j] = 40 + j; /* queries 0..39 see no key */
	prob_run(&r, true);
	prob_check(&r, "late key block");
	int64_t zero = 1;
	for (int64_t i = 0; i < 40 * 2 * 16; i++)
		zero &= r.of[i] == 0;
	EXPECT(zero, "queries that see no key must get out 0");
	prob_free(&r);
}

TEST_CASE(threads_bitwise)
{
#ifdef _OPENMP
	struct prob p = prob_make(2, 190, 190, 4, 2, 64);
	const int64_t nq = p.nq, nk = p.nk, nl = p.nl;
	float *o1 = fal(nq), *l1 = fal(nl), *dq1 = fal(nq), *dk1 = fal(nk), *dv1 = fal(nk);
	int saved = omp_get_max_threads();
	for (int t = 1; t <= 2; t++) {
		omp_set_num_threads(t);
		float *o = t == 1 ? o1 : p.of, *l = t == 1 ? l1 : p.lf;
		float *dq = t == 1 ? dq1 : p.dqf, *dk = t == 1 ? dk1 : p.dkf, *dv = t == 1 ? dv1 : p.dvf;
		memset(dq, 0, (size_t)nq * 4), memset(dk, 0, (size_t)nk * 4), memset(dv, 0, (size_t)nk * 4);
		attention_bf16_forward(o, l, p.qf, p.kf, p.vf, 2, 190, 4, 2, 64);
		attention_bf16_backward(dq, dk, dv, p.gf, o, l, p.qf, p.kf, p.vf, 2, 190, 4, 2, 64);
	}
	omp_set_num_threads(saved);
	EXPECT(!memcmp(o1, p.of, (size_t)nq * 4) && !memcmp(l1, p.lf, (size_t)nl * 4),
	       "forward differs between 1 and 2 threads");
	EXPECT(!memcmp(dq1, p.dqf, (size_t)nq * 4) && !memcmp(dk1, p.dkf, (size_t)nk * 4) &&
	           !memcmp(dv1, p.dvf, (size_t)nk * 4),
	       "backward differs between 1 and 2 threads");
	free(o1), free(l1), free(dq1), free(dk1), free(dv1);
	prob_free(&p);
#endif
}

/* The tiles' exponential against exp in double, on fresh random rows over softmax's range and
 * its edges. The kernel computes t = (x - m) log2 e as fma(x, log2 e, -fl(m log2 e)), then 2^t;
 * the second step is checked tightly against exp2 of that same t in double: relative error
 * <= 3e-7 where the result is normal (the fit's 2.3e-7 and the final rounding), within 2^-149
 * (+ that) in the subnormal range, exactly 0 for -inf, NaN kept. The whole against exp(x - m)
 * in double carries t's roundings too, 2^-24 (|x| + |m|) log2 e absolute in t: bound 3e-7 +
 * 1.2e-7 (|x| + |m|) relative. The row sum (fp32, a fixed tree of 64 terms) within 1e-6 of
 * the outputs' sum in double. */
TEST_CASE(exponential)
{
	static const float edges[] = {0.0f, -1e-30f, -0.34657359f, -0.5f, -1.0f, -87.3f, -88.0f,
	                              -95.0f, -103.0f, -104.0f, -110.0f, -1e30f};
	const float l2e = 1.44269504088896341f;
	double worst = 0, worst_t = 0;
	for (int rep = 0; rep < 200; rep++) {
		float x[64], y[64];
		const float m = rep == 0 ? 0.0f : (float)test_uniform(-20, 20);
		for (int j = 0; j < 64; j++)
			x[j] = m + (float)(rep % 2 ? test_uniform(-110, 0) : test_uniform(-8, 0));
		if (rep == 0)
			for (int j = 0; j < (int)(sizeof(edges) / sizeof(edges[0])); j++)
				x[j] = edges[j];
		if (rep == 1)
			x[63] = -INFINITY;
		memcpy(y, x, sizeof(x));
		const double sum = attention_bf16_row_exp(y, m);
		double out_sum = 0;
		for (int j = 0; j < 64; j++) {
			const double e2 = exp2((double)fmaf(x[j], l2e, -(m * l2e)));
			const double e = exp((double)x[j] - (double)m);
			out_sum += y[j];
			if (e2 >= 0x1p-126) {
				const double r2 = fabs(y[j] - e2) / e2, r = fabs(y[j] - e) / e;
				worst = fmax(worst, r2);
				worst_t = fmax(worst_t, r);
				EXPECT(r2 <= 3e-7, "2^t for exp(%.9g - %.9g) = %.9g, want %.9g (%.2e relative)",
				       (double)x[j], (double)m, (double)y[j], e2, r2);
				EXPECT(r <= 3e-7 + 1.2e-7 * (fabs(x[j]) + fabs(m)),
				       "exp(%.9g - %.9g) = %.9g, want %.9g (%.2e relative)", (double)x[j],
				       (double)m, (double)y[j], e, r);
			} else
				EXPECT(fabs(y[j] - e2) <= 0x1p-149 + 3e-7 * e2 && y[j] >= 0,
				       "exp(%.9g - %.9g) = %.9g, want %.9g (subnormal)", (double)x[j],
				       (double)m, (double)y[j], e2);
		}
		EXPECT(fabs(sum - out_sum) <= 1e-6 * out_sum, "row sum %.9g, want %.9g", sum, out_sum);
		if (rep == 1)
			EXPECT(y[63] == 0.0f, "exp(-inf) = %g, want 0", (double)y[63]);
	}
	float z[64];
	for (int j = 0; j < 64; j++)
		z[j] = (float)test_uniform(-4, 0);
	z[5] = NAN;
	attention_bf16_row_exp(z, 0);
	EXPECT(isnan(z[5]), "exp(NaN) = %g, want NaN", (double)z[5]);
	printf("  exponential: worst relative error of 2^t %.2e, of exp(x - m) %.2e\n", worst,
	       worst_t);
}

TEST_CASE(selection)
{
	EXPECT(attention_bf16_usable(64) && attention_bf16_usable(16), "usable for D = 64, 16");
	EXPECT(!attention_bf16_usable(8) && !attention_bf16_usable(40), "not for D = 8, 40");
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_F32);
	EXPECT(!attention_mixed_is_bf16(64), "fp32 compute runs the fp32 kernel");
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_BF16);
	EXPECT(attention_mixed_is_bf16(64) && attention_mixed_is_bf16(32),
	       "bf16 compute runs the bf16 kernel");
	EXPECT(attention_mixed_is_bf16(16), "the debug model's D = 16 runs the bf16 kernel too");
	setenv("CT_ATTENTION", "f32", 1);
	EXPECT(!attention_mixed_is_bf16(64), "CT_ATTENTION=f32 turns it off");
	unsetenv("CT_ATTENTION");
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_F32);
}

int main(void)
{
	if (!attention_bf16_usable(64)) {
		printf("skipped: this CPU has no AVX512-BF16 (the bf16 attention kernel is not used "
		       "here)\n");
		return 77;
	}
	test_seed();
	RUN(causal_shapes);
	RUN(positions);
	RUN(threads_bitwise);
	RUN(exponential);
	RUN(selection);
	return test_summary();
}
