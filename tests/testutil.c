#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "comm/comm.h"
#include "kernels/kernels.h"
#include "kernels/mm_engine.h"
#include "parallel/engine.h"
#include "model/model.h"
#include "optim/grad_norm.h"
#include "optim/optim.h"
#include "train/compute.h"

int test_failures_in_case;
static int tests_passed, tests_failed;
static uint64_t rng_state;

static uint64_t seed_value;
static bool seed_have;

static void seed_set(uint64_t seed, bool print)
{
	if (print)
		fprintf(stderr, "test seed %llu (set CT_TEST_SEED to reproduce)\n",
		        (unsigned long long)seed);
	seed_value = seed;
	rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
	seed_have = true;
}

uint64_t test_seed(void)
{
	if (!seed_have) {
		const char *s = getenv("CT_TEST_SEED");
		seed_set(s ? strtoull(s, NULL, 10) : ((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16)),
		         true);
	}
	return seed_value;
}

uint64_t test_seed_all(const struct comm_group *g)
{
	/* ranks other than 0 contribute 0 to the sum: a broadcast through the all-reduce */
	int64_t s = g->rank == 0 ? (int64_t)test_seed() : 0;
	comm_all_reduce_i64(g, &s, 1);
	if (g->rank != 0)
		seed_set((uint64_t)s, false);
	return (uint64_t)s;
}

int test_summary_all(const struct comm_group *g)
{
	int64_t n[2] = {tests_passed, tests_failed};
	comm_all_reduce_i64(g, n, 2);
	if (g->rank == 0)
		printf("%lld passed, %lld failed (all %d ranks)\n", (long long)n[0], (long long)n[1],
		       g->size);
	return n[1] ? 1 : 0;
}

static uint64_t test_next(void)
{
	test_seed();
	/* splitmix64 */
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

double test_uniform(double lo, double hi)
{
	return lo + (hi - lo) * (double)(test_next() >> 11) * (1.0 / 9007199254740992.0);
}

void test_fill(double *x, int64_t n, double lo, double hi)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = test_uniform(lo, hi);
}

void test_fill_f32(float *x, int64_t n, double lo, double hi)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)test_uniform(lo, hi);
}

double rel_err_f64(const double *a, const double *b, int64_t n)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < n; i++) {
		num += (a[i] - b[i]) * (a[i] - b[i]);
		den += b[i] * b[i];
	}
	return sqrt(num) / fmax(sqrt(den), 1e-300);
}

double rel_err_f32(const float *a, const float *b, int64_t n)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < n; i++) {
		double d = (double)a[i] - (double)b[i];
		num += d * d;
		den += (double)b[i] * b[i];
	}
	return sqrt(num) / fmax(sqrt(den), 1e-300);
}

void test_run(const char *name, void (*fn)(void))
{
	test_failures_in_case = 0;
	fn();
	if (test_failures_in_case) {
		tests_failed++;
		fprintf(stderr, "[FAIL] %s\n", name);
	} else {
		tests_passed++;
		fprintf(stderr, "[ ok ] %s\n", name);
	}
}

int test_summary(void)
{
	printf("%d passed, %d failed\n", tests_passed, tests_failed);
	return tests_failed ? 1 : 0;
}

int train_step(struct model *m, struct adamw *opt, const int32_t *tokens, const int32_t *targets,
               int64_t accum, double lr, double max_norm, struct train_step_result *res)
{
	int64_t N = m->N;
	int64_t valid = llama_count_valid(targets, accum * N);
	memset(m->grads, 0, (size_t)m->table->numel * sizeof(float));
	double dscale = valid > 0 ? 1.0 / (double)valid : 0.0;
	model_set_loss_dscale(m, dscale);
	double loss_sum = 0.0;
	bool bf16 = mm_engine_dtype() == MM_BF16;
	if (bf16)
		compute_bind_bf16_params(m, true);
	for (int64_t a = 0; a < accum; a++) {
		memcpy(m->tokens, tokens + a * N, (size_t)N * sizeof(int32_t));
		memcpy(m->targets, targets + a * N, (size_t)N * sizeof(int32_t));
		loss_sum += model_forward(m, NULL);
		model_backward(m, dscale);
	}
	if (bf16)
		compute_bind_bf16_params(m, false);
	double gscale;
	int rc = grad_norm_finish(res, loss_sum, sumsq_f32(m->grads, m->table->numel), valid,
	                          max_norm, &gscale);
	if (rc)
		return rc;
	adamw_step(opt, m->table, m->params, m->grads, lr, gscale);
	int64_t n_stats = model_step_stats(m, NULL);
	if (n_stats) { /* one rank: its statistics are the whole step's */
		double *stats = xcalloc((size_t)n_stats, sizeof(double));
		model_step_stats(m, stats);
		model_after_step(m, stats);
		free(stats);
	}
	return CT_OK;
}

int engine_run(const struct engine *e, const int32_t *tokens, const int32_t *targets, int64_t accum,
               struct adamw *opt, double lr, double max_norm, struct train_step_result *res)
{
	const struct engine_step_in in = {.tokens = tokens,
	                                  .targets = targets,
	                                  .accum = accum,
	                                  .opt = opt,
	                                  .lr = lr,
	                                  .max_norm = max_norm,
	                                  .res = res};
	return engine_step(e, &in);
}
