/* tests/test_hyena_gen: Hyena generation (infer/hyena_gen) against the model's parallel
 * full-sequence forward (hyena_logits), in every mixer mode.
 *
 * Teacher forcing: a fixed random token sequence is fed (its first P tokens as a prompt in one
 * pass, the rest one position at a time) and the logits at every position are compared with
 * the full forward's. fp64: max |dlogit| <= 1e-9 (both sides are exact up to rounding:
 * measured ~1e-13; a wrong tap or a missed tile moves logits by ~1e-3 or more). fp32:
 * max |dlogit| <= 1e-4 * max |logit| (FFT vs direct sums in float: measured ~1e-6).
 * Greedy decoding must give identical tokens in all modes in fp64; in fp32 too for this
 * model and seed range (a near-tie could flip one, so fp32 only reports).
 * Weights are random (the init plus noise on every parameter, so no tensor is trivially zero
 * or one); several batch rows, prompt lengths 0, 1, odd, 2^k, 2^k+1; orders 2 and 3.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "infer/hyena_gen.h"
#include "model/hyena/hyena.h"
#include "testutil.h"

struct fixture {
	struct hyena_config c;
	struct param_table t;
	float *p32;
	double *p64;
	int64_t B, T;
	int32_t *tokens; /* (B, T) */
	double *ref64;   /* (B, T, V) */
	float *ref32;
};

static void fixture_build(struct fixture *f, int64_t order, int64_t B, int64_t T)
{
	memset(f, 0, sizeof(*f));
	CHECK(hyena_config_preset(&f->c, "hyena-debug") == 0, "preset");
	f->c.order = order;
	f->c.l_max = T;
	CHECK(hyena_config_finish(&f->c) == 0, "config");
	hyena_table_build(&f->t, &f->c);
	int64_t n = f->t.numel;
	f->p32 = malloc((size_t)n * sizeof(float));
	f->p64 = malloc((size_t)n * sizeof(double));
	hyena_init_params(&f->c, &f->t, test_seed(), f->p32, 0, n);
	for (int64_t i = 0; i < n; i++) {
		f->p32[i] += (float)test_uniform(-0.05, 0.05);
		f->p64[i] = f->p32[i];
	}
	f->B = B, f->T = T;
	f->tokens = malloc((size_t)(B * T) * sizeof(int32_t));
	for (int64_t i = 0; i < B * T; i++)
		f->tokens[i] = (int32_t)test_uniform(0, (double)f->c.vocab_size);
	const int64_t V = f->c.vocab_size;
	f->ref64 = malloc((size_t)(B * T * V) * sizeof(double));
	f->ref32 = malloc((size_t)(B * T * V) * sizeof(float));
	for (int prec = 0; prec < 2; prec++) {
		struct hyena_model m;
		struct hyena_build_opts bo = {.own_params = true, .f64 = prec == 1};
		CHECK(hyena_build(&m, &f->c, B, T, &bo) == 0, "build");
		memcpy(m.tokens, f->tokens, (size_t)(B * T) * sizeof(int32_t));
		if (prec == 1) {
			memcpy(m.params64, f->p64, (size_t)n * sizeof(double));
			hyena_logits_f64(&m, f->ref64);
		} else {
			memcpy(m.params, f->p32, (size_t)n * sizeof(float));
			hyena_logits(&m, f->ref32);
		}
		hyena_free(&m);
	}
}

static void fixture_free(struct fixture *f)
{
	param_table_free(&f->t);
	free(f->p32), free(f->p64), free(f->tokens), free(f->ref64), free(f->ref32);
}

/* Teacher-forced logits of one mode and prompt length: max error vs the reference (absolute
 * in fp64, relative to max |logit| in fp32). */
static double forced(const struct fixture *f, bool f64, enum oc_mode mode, int64_t P, int64_t thr)
{
	const int64_t B = f->B, T = f->T, V = f->c.vocab_size;
	struct hgen_opts o = {.mode = mode, .thr = thr, .B = B, .max_len = T, .n_prompt = P};
	int32_t *tok = malloc((size_t)(B * (P > 1 ? P : 1)) * sizeof(int32_t));
	double *lg = malloc((size_t)(B * T * V) * sizeof(double)); /* (B, T, V) */
	float *pl32 = malloc((size_t)(B * (P > 1 ? P : 1) * V) * sizeof(float));
	double *pl64 = malloc((size_t)(B * (P > 1 ? P : 1) * V) * sizeof(double));
	struct hgen_f32 *g32 = f64 ? NULL : hgen_create_f32(&f->c, &f->t, f->p32, &o);
	struct hgen_f64 *g64 = f64 ? hgen_create_f64(&f->c, &f->t, f->p64, &o) : NULL;
	if (P > 0) {
		for (int64_t b = 0; b < B; b++)
			memcpy(tok + b * P, f->tokens + b * T, (size_t)P * sizeof(int32_t));
		if (f64)
			hgen_prompt_f64(g64, tok, pl64);
		else
			hgen_prompt_f32(g32, tok, pl32);
		for (int64_t b = 0; b < B; b++)
			for (int64_t i = 0; i < P * V; i++)
				lg[b * T * V + i] = f64 ? pl64[b * P * V + i] : pl32[b * P * V + i];
	}
	for (int64_t t = P; t < T; t++) {
		for (int64_t b = 0; b < B; b++)
			tok[b] = f->tokens[b * T + t];
		if (f64) {
			const double *l = hgen_step_f64(g64, tok);
			for (int64_t b = 0; b < B; b++)
				memcpy(lg + (b * T + t) * V, l + b * V, (size_t)V * sizeof(double));
		} else {
			const float *l = hgen_step_f32(g32, tok);
			for (int64_t b = 0; b < B; b++)
				for (int64_t i = 0; i < V; i++)
					lg[(b * T + t) * V + i] = l[b * V + i];
		}
	}
	double err = 0, scale = 0;
	for (int64_t i = 0; i < B * T * V; i++) {
		double r = f64 ? f->ref64[i] : (double)f->ref32[i];
		double d = fabs(lg[i] - r);
		err = d > err || isnan(d) ? d : err;
		scale = fmax(scale, fabs(r));
	}
	hgen_free_f32(g32);
	hgen_free_f64(g64);
	free(tok), free(lg), free(pl32), free(pl64);
	return f64 ? err : err / scale;
}

static void teacher_forcing(int64_t order)
{
	struct fixture f;
	fixture_build(&f, order, 2, 70);
	const int64_t prompts[] = {0, 1, 7, 16, 17};
	for (int m = 0; m < OC_MODE_COUNT; m++)
		for (size_t j = 0; j < sizeof(prompts) / sizeof(prompts[0]); j++)
			for (int prec = 0; prec < 2; prec++) {
				bool f64 = prec == 1;
				int64_t P = prompts[j], thr = j % 2 ? 0 : 8;
				double e = forced(&f, f64, (enum oc_mode)m, P, thr);
				double tol = f64 ? 1e-9 : 1e-4;
				EXPECT(e <= tol,
				       "%s order %lld mode %s P=%lld thr=%lld: error %.3g > %.0e",
				       f64 ? "fp64" : "fp32", (long long)order,
				       oc_mode_name((enum oc_mode)m), (long long)P, (long long)thr,
				       e, tol);
				if (getenv("CT_VERBOSE"))
					fprintf(stderr, "  %s N=%lld %-9s P=%-3lld e=%.3g\n",
					        f64 ? "fp64" : "fp32", (long long)order,
					        oc_mode_name((enum oc_mode)m), (long long)P, e);
			}
	fixture_free(&f);
}

TEST_CASE(teacher_forcing_order2)
{
	teacher_forcing(2);
}
TEST_CASE(teacher_forcing_order3)
{
	teacher_forcing(3);
}

/* greedy tokens of one mode from a prompt of P (double or float decoder, B = 1) */
static void greedy(const struct fixture *f, bool f64, enum oc_mode mode, int64_t P, int64_t n,
                   int32_t *out)
{
	struct hgen_opts o = {.mode = mode, .thr = 4, .B = 1, .max_len = P + n, .n_prompt = P};
	struct gen_opts go = {.max_new_tokens = n, .temperature = 0, .stop_id = -1};
	if (!f64) {
		struct hgen_f32 *g = hgen_create_f32(&f->c, &f->t, f->p32, &o);
		int64_t k = hgen_generate(g, f->tokens, &go, out);
		EXPECT(k == n, "generated %lld of %lld", (long long)k, (long long)n);
		hgen_free_f32(g);
		return;
	}
	struct hgen_f64 *g = hgen_create_f64(&f->c, &f->t, f->p64, &o);
	const double *l = hgen_prompt_f64(g, f->tokens, NULL);
	const int64_t V = f->c.vocab_size;
	for (int64_t i = 0; i < n; i++) {
		int32_t best = 0;
		for (int64_t v = 1; v < V; v++)
			best = l[v] > l[best] ? (int32_t)v : best;
		out[i] = best;
		if (i + 1 < n)
			l = hgen_step_f64(g, &best);
	}
	hgen_free_f64(g);
}

TEST_CASE(greedy_identical)
{
	struct fixture f;
	fixture_build(&f, 2, 1, 80);
	const int64_t P = 5, n = 75;
	int32_t ref[75], got[75];
	for (int prec = 1; prec >= 0; prec--) {
		greedy(&f, prec == 1, OC_LAZY, P, n, ref);
		for (int m = 1; m < OC_MODE_COUNT; m++) {
			greedy(&f, prec == 1, (enum oc_mode)m, P, n, got);
			int64_t diff = -1;
			for (int64_t i = 0; i < n && diff < 0; i++)
				diff = got[i] != ref[i] ? i : -1;
			if (prec == 1)
				EXPECT(diff < 0, "fp64 greedy: %s differs from lazy at token %lld",
				       oc_mode_name((enum oc_mode)m), (long long)diff);
			else if (diff >= 0)
				fprintf(stderr,
				        "  note: fp32 greedy %s differs from lazy at token %lld "
				        "(near-tie)\n",
				        oc_mode_name((enum oc_mode)m), (long long)diff);
		}
	}
	fixture_free(&f);
}

int main(void)
{
	/* one thread: the per-token kernels are tiny, and OpenMP barriers on a loaded 2-core CI
	 * machine cost milliseconds each (38 s instead of 3 s); the parallel tile phase is
	 * covered by test_online_conv */
	omp_set_num_threads(1);
	test_seed();
	RUN(teacher_forcing_order2);
	RUN(teacher_forcing_order3);
	RUN(greedy_identical);
	return test_summary();
}
