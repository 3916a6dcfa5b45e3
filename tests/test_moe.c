/* Mixture-of-experts (deepseek_v3 family) tests: the table; the whole model's gradients
 * against central finite differences in double (the router's gate, the experts, the shared
 * experts, attention and the dense block; softmax and sigmoid scores, route_norm and
 * route_scale, a non-zero balancing bias, the sequence-wise auxiliary loss); float vs
 * double; the routing (every slot lands in its expert's contiguous rows, no token dropped,
 * empty experts); the bias update; determinism; activation checkpointing (every mode
 * bitwise mode none's, the balancing counts not doubled, fewer bytes); and the independent
 * PyTorch float64 reference (tests/reference/moe_ref.py; `test_moe --reference`). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"
#include "io/safetensors.h"
#include "base/mem.h"
#include "model/model.h"
#include "model/model_cost.h"
#include "model/moe/moe.h"
#include "optim/optim.h"
#include "testutil.h"
#include "train/lr_schedule.h"

static void rand_batch(int32_t *tok, int32_t *tgt, int64_t n, int64_t V, bool ignores)
{
	for (int64_t i = 0; i < n; i++) {
		tok[i] = (int32_t)test_uniform(0, (double)V);
		tgt[i] = (int32_t)test_uniform(0, (double)V);
		if (ignores && i % 7 == 3)
			tgt[i] = -100;
	}
}

/* A tiny config: 3 blocks (1 dense, 2 MoE), 4 experts top-2, 1 shared. */
static void tiny_config(struct moe_config *c, enum moe_score score, bool route_norm,
                        double route_scale, double aux_alpha)
{
	CHECK(moe_config_preset(c, "deepseek_v3-debug") == CT_OK, "preset");
	c->vocab_size = 17;
	c->dim = 16;
	c->n_layers = 3;
	c->n_heads = 4;
	c->n_kv_heads = 2;
	c->inter_dim = 12;
	c->moe_inter_dim = 8;
	c->n_dense_layers = 1;
	c->n_routed_experts = 4;
	c->n_shared_experts = 1;
	c->top_k = 2;
	c->score_func = score;
	c->route_norm = route_norm;
	c->route_scale = route_scale;
	c->aux_loss_alpha = aux_alpha;
	CHECK(moe_config_finish(c) == CT_OK, "finish");
}

static int64_t n_moe_bias(const struct moe_model *m)
{
	return (m->cfg.n_layers - m->cfg.n_dense_layers) * m->cfg.n_routed_experts;
}

/* the chosen experts of every MoE layer, to tell a finite difference that crossed a routing
 * decision (the loss is piecewise smooth in the router's logits) */
static void routing_of(const struct moe_model *m, int32_t *out)
{
	int64_t NK = m->N * m->cfg.top_k, j = 0;
	for (int l = (int)m->cfg.n_dense_layers; l < m->cfg.n_layers; l++, j += NK)
		memcpy(out + j, m->iacts + m->blk[l].idx, (size_t)NK * sizeof(int32_t));
}

/* ------------------------------------------------------------ finite differences */

static double loss_f64(struct moe_model *m, int64_t *valid)
{
	m->loss_dscale = 0; /* no token counting */
	return moe_forward(m, valid);
}

static void fd_model(enum moe_score score, bool route_norm, double route_scale, double aux)
{
	struct moe_config c;
	tiny_config(&c, score, route_norm, route_scale, aux);
	struct moe_model m;
	const struct moe_build_opts o64 = {.own_params = true, .f64 = true};
	CHECK(moe_build(&m, &c, 2, 6, &o64) == CT_OK, "build");
	int64_t n = m.table.numel, nb = n_moe_bias(&m), NK = m.N * c.top_k;
	int64_t nr = (c.n_layers - c.n_dense_layers) * NK;
	float *init = malloc((size_t)n * sizeof(float));
	moe_init_params(&m.cfg, &m.table, test_seed(), init, 0, n);
	for (int64_t i = 0; i < n; i++) /* scale up the small inits so every path matters */
		m.params64[i] = (double)init[i] * (fabs(init[i]) < 0.1 ? 10.0 : 1.0);
	for (int64_t i = 0; i < nb; i++) /* a bias that changes some choices */
		m.bias[i] = test_uniform(-0.05, 0.05);
	rand_batch(m.tokens, m.targets, m.N, c.vocab_size, true);
	int64_t valid;
	double base = loss_f64(&m, &valid);
	CHECK(valid > 0, "valid");
	int32_t *r0 = malloc((size_t)nr * sizeof(int32_t)), *r1 = malloc((size_t)nr * sizeof(int32_t));
	routing_of(&m, r0);
	double aux_sum = 0;
	for (int l = 0; l < c.n_layers; l++)
		aux_sum += m.aux_sum[l];
	EXPECT(aux == 0 ? aux_sum == 0 : aux_sum > 0, "aux loss sum %g with alpha %g", aux_sum, aux);
	memset(m.grads64, 0, (size_t)n * sizeof(double));
	moe_backward(&m, 1.0 / (double)valid);
	double *num = calloc((size_t)n, sizeof(double));
	bool *skip = calloc((size_t)n, sizeof(bool));
	int64_t skipped = 0;
	for (int64_t i = 0; i < n; i++) {
		double keep = m.params64[i], h = 1e-5 * fmax(1.0, fabs(keep)), f[4];
		const double at[4] = {2, 1, -1, -2};
		for (int k = 0; k < 4; k++) {
			m.params64[i] = keep + at[k] * h;
			f[k] = loss_f64(&m, NULL);
			routing_of(&m, r1);
			skip[i] |= memcmp(r0, r1, (size_t)nr * sizeof(int32_t)) != 0;
		}
		m.params64[i] = keep;
		skipped += skip[i];
		num[i] = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h) / (double)valid;
	}
	double rms = 0;
	for (int64_t i = 0; i < n; i++)
		rms += num[i] * num[i];
	rms = sqrt(rms / (double)n);
	double worst = 0, worst_router = 0, worst_expert = 0;
	for (int i = 0; i < m.table.count; i++) {
		const struct param_entry *p = &m.table.p[i];
		double d2 = 0, b2 = 0;
		for (int64_t j = p->offset; j < p->offset + p->numel; j++) {
			if (skip[j])
				continue;
			d2 += (m.grads64[j] - num[j]) * (m.grads64[j] - num[j]);
			b2 += num[j] * num[j];
		}
		double e = sqrt(d2) / fmax(sqrt(b2), rms * sqrt((double)p->numel));
		if (e > 1e-7)
			fprintf(stderr, "  %s: rel err %.3e\n", p->name, e);
		worst = fmax(worst, e);
		if (strstr(p->name, "router"))
			worst_router = fmax(worst_router, e);
		if (strstr(p->name, "experts"))
			worst_expert = fmax(worst_expert, e);
	}
	fprintf(stderr,
	        "  %s%s scale %g aux %g: loss %.6f, %lld params (%lld skipped: a routing change "
	        "inside the stencil), FD rel err %.3e worst tensor, router %.3e, experts %.3e\n",
	        moe_score_name(score), route_norm ? " route_norm" : "", route_scale, aux,
	        base / (double)valid, (long long)n, (long long)skipped, worst, worst_router,
	        worst_expert);
	EXPECT(skipped < n / 50, "%lld of %lld differences crossed a routing change",
	       (long long)skipped, (long long)n);
	/* five-point differences with h = 1e-5 in double: truncation ~h^4, rounding ~1e-16/h */
	EXPECT(worst < 1e-6, "finite-difference rel err %.3e", worst);
	free(num), free(skip), free(init), free(r0), free(r1);
	moe_free(&m);
}

TEST_CASE(test_fd_softmax_aux)
{
	fd_model(MOE_SCORE_SOFTMAX, false, 1.5, 0.1);
}

TEST_CASE(test_fd_sigmoid_norm_aux)
{
	fd_model(MOE_SCORE_SIGMOID, true, 2.5, 0.1);
}

/* ------------------------------------------------------------ routing, float vs double */

TEST_CASE(test_table)
{
	struct moe_config c;
	tiny_config(&c, MOE_SCORE_SOFTMAX, false, 1.0, 0.0);
	struct param_table t;
	moe_table_build(&t, &c);
	EXPECT(t.n_units == 5, "units %d", t.n_units);
	const struct param_entry *e = param_table_find(&t, "layers.1.moe.experts.w2");
	EXPECT(e && e->shape[0] == 4 * 16 && e->shape[1] == 8, "experts.w2 (E*C, Fm)");
	EXPECT(param_table_find(&t, "layers.0.feed_forward.w1.weight") &&
	           !param_table_find(&t, "layers.0.moe.router.gate.weight") &&
	           param_table_find(&t, "layers.2.moe.router.gate.weight") &&
	           param_table_find(&t, "layers.2.moe.shared_experts.w3.weight"),
	       "dense block 0, MoE blocks 1-2");
	int i = moe_tensor_index(&c, 2, MB_GATE);
	EXPECT(i >= 0 && strcmp(t.p[i].name, "layers.2.moe.router.gate.weight") == 0,
	       "tensor index");
	param_table_free(&t);
	struct moe_config big;
	CHECK(moe_config_preset(&big, "deepseek_v3-671B") == CT_OK, "671B");
	moe_table_build(&t, &big);
	/* GQA in place of MLA: ~687B parameters, ~38B active (MLA: 671B / 37B) */
	fprintf(stderr, "  671B shapes: %.1fB parameters, %.1fB active\n", (double)t.numel / 1e9,
	        (double)moe_active_params(&big) / 1e9);
	EXPECT(t.numel > 600e9 && t.numel < 720e9, "671B preset has %lld", (long long)t.numel);
	param_table_free(&t);
}

/* The float model routes every (token, slot) to a row of its expert's contiguous range, in
 * token order, drops none, skips empty experts; float and double agree. */
TEST_CASE(test_routing_and_float_vs_double)
{
	struct moe_config c;
	tiny_config(&c, MOE_SCORE_SIGMOID, true, 2.5, 0.05);
	struct moe_model mf, md;
	const struct moe_build_opts of = {.own_params = true}, od = {.own_params = true, .f64 = true};
	CHECK(moe_build(&mf, &c, 3, 8, &of) == CT_OK && moe_build(&md, &c, 3, 8, &od) == CT_OK,
	      "build");
	int64_t n = mf.table.numel, E = c.n_routed_experts, K = c.top_k, N = mf.N;
	moe_init_params(&mf.cfg, &mf.table, test_seed(), mf.params, 0, n);
	for (int64_t i = 0; i < n; i++)
		md.params64[i] = mf.params[i];
	/* layer 2: a bias that sends nearly everything to experts 0 and 1 (2, 3 left empty) */
	for (int64_t e = 0; e < E; e++)
		mf.bias[E + e] = md.bias[E + e] = e < 2 ? 10.0 : 0.0;
	rand_batch(mf.tokens, mf.targets, N, c.vocab_size, true);
	memcpy(md.tokens, mf.tokens, (size_t)(2 * N) * sizeof(int32_t));
	mf.loss_dscale = 1.0; /* counts kept */
	int64_t vf, vd;
	double lf = moe_forward(&mf, &vf) / (double)vf, ld = moe_forward(&md, &vd) / (double)vd;
	EXPECT(fabs(lf - ld) < 1e-5 * fabs(ld), "loss float %.8f double %.8f", lf, ld);
	memset(mf.grads, 0, (size_t)n * sizeof(float));
	memset(md.grads64, 0, (size_t)n * sizeof(double));
	moe_backward(&mf, 1.0 / (double)vf);
	moe_backward(&md, 1.0 / (double)vd);
	double d2 = 0, b2 = 0;
	for (int64_t i = 0; i < n; i++)
		d2 += pow(mf.grads[i] - md.grads64[i], 2), b2 += pow(md.grads64[i], 2);
	EXPECT(sqrt(d2 / b2) < 1e-4, "grads float vs double rel err %.3e", sqrt(d2 / b2));
	for (int l = (int)c.n_dense_layers; l < c.n_layers; l++) {
		const struct moe_block_acts *a = &mf.blk[l];
		const int32_t *idx = mf.iacts + a->idx, *pos = mf.iacts + a->pos;
		const int32_t *off = mf.iacts + a->off;
		int32_t *seen = calloc((size_t)(N * K), sizeof(int32_t));
		int64_t bad = 0, last_row = -1;
		EXPECT(off[0] == 0 && off[E] == N * K, "layer %d: %d .. %d rows", l, off[0], off[E]);
		for (int64_t i = 0; i < N * K; i++) {
			int32_t e = idx[i], r = pos[i];
			bad += r < off[e] || r >= off[e + 1] || seen[r]++;
			for (int64_t k = 0; k < i % K; k++)
				bad += idx[i - 1 - k] == e; /* a token's K experts differ */
		}
		for (int64_t e = 0; e < E; e++) /* token order inside each expert's rows */
			for (int64_t i = 0, prev = -1; i < N * K; i++)
				if (idx[i] == e) {
					bad += pos[i] <= prev;
					prev = pos[i];
				}
		(void)last_row;
		EXPECT(bad == 0, "layer %d: %lld slots misplaced", l, (long long)bad);
		free(seen);
		double cnt = 0;
		for (int64_t e = 0; e < E; e++)
			cnt += mf.counts[(l - c.n_dense_layers) * E + e];
		EXPECT(cnt == (double)(N * K), "layer %d: %g of %lld slots counted", l, cnt,
		       (long long)(N * K));
	}
	const int32_t *off2 = mf.iacts + mf.blk[2].off;
	EXPECT(off2[2] == N * K && off2[4] == N * K, "layer 2: the bias leaves experts 2, 3 empty");
	moe_free(&mf);
	moe_free(&md);
}

static bool metric_is(const struct model_step_metric *f, int n, const char *name, double v)
{
	for (int i = 0; i < n; i++)
		if (strcmp(f[i].name, name) == 0)
			return f[i].value == v;
	return false;
}

/* sign(mean - load), zero-mean, per layer; counts reset by step_stats */
TEST_CASE(test_bias_update)
{
	struct moe_config c;
	tiny_config(&c, MOE_SCORE_SOFTMAX, false, 1.0, 0.0);
	c.load_balance_coeff = 0.5;
	struct moe_model m;
	const struct moe_build_opts o = {.own_params = true};
	CHECK(moe_build(&m, &c, 1, 4, &o) == CT_OK, "build");
	const double counts[8] = {5, 1, 1, 1, 2, 2, 2, 2};
	memcpy(m.counts, counts, sizeof(counts));
	double got[8];
	EXPECT(moe_step_stats(&m, got) == 8 && memcmp(got, counts, sizeof(got)) == 0, "stats");
	EXPECT(moe_step_stats(&m, got) == 8 && got[0] == 0, "stats reset");
	moe_after_step(&m, counts);
	/* layer 1: mean 2: delta (-.5, .5, .5, .5), minus its mean .25; layer 2: all at the mean */
	const double want[8] = {-0.75, 0.25, 0.25, 0.25, 0, 0, 0, 0};
	double err = 0;
	for (int i = 0; i < 8; i++)
		err = fmax(err, fabs(m.bias[i] - want[i]));
	EXPECT(err < 1e-15, "bias update off by %g", err);
	struct model_step_metric fig[16];
	int nf = moe_step_metrics(&m, fig, 16);
	/* layer 1: max 5 / mean 2; layer 2: 1; the bias's largest magnitude .75; after one step
	 * the load over the window is that step's */
	EXPECT(nf == 7 && strcmp(fig[0].name, "moe_load_max_mean") == 0 && fig[0].value == 2.5 &&
	           fig[0].console && fig[1].value == 0.75 &&
	           strcmp(fig[2].name, "moe_load_max_mean_w100") == 0 && fig[2].value == 2.5 &&
	           metric_is(fig, nf, "moe_load_max_mean/layer.1", 2.5) &&
	           metric_is(fig, nf, "moe_load_max_mean/layer.2", 1.0) &&
	           metric_is(fig, nf, "moe_load_max_mean_w100/layer.1", 2.5) &&
	           metric_is(fig, nf, "moe_load_max_mean_w100/layer.2", 1.0),
	       "step metrics (%d): %s %g, %s %g", nf, fig[0].name, fig[0].value, fig[1].name,
	       fig[1].value);
	/* a second step balanced in layer 1: the window holds both, (5+2) / ((8+8)/4) = 1.75 */
	const double even[8] = {2, 2, 2, 2, 2, 2, 2, 2};
	moe_after_step(&m, even);
	nf = moe_step_metrics(&m, fig, 16);
	EXPECT(fig[0].value == 1.0 && fig[2].value == 1.75 &&
	           metric_is(fig, nf, "moe_load_max_mean_w100/layer.1", 1.75),
	       "after a balanced step: per step %g, over the window %g", fig[0].value,
	       fig[2].value);
	moe_free(&m);
	c.load_balance_coeff = 0; /* the loads are still measured, the bias stays */
	CHECK(moe_build(&m, &c, 1, 4, &o) == CT_OK, "build");
	EXPECT(moe_step_stats(&m, NULL) == 8, "statistics without balancing");
	moe_after_step(&m, counts);
	EXPECT(m.bias[0] == 0 && moe_step_metrics(&m, fig, 16) == 7 && fig[0].value == 2.5,
	       "without balancing: no bias, the load measured");
	moe_free(&m);
}

/* Two identical training runs through the model interface: the same bits. */
TEST_CASE(test_determinism)
{
	struct moe_config c;
	tiny_config(&c, MOE_SCORE_SOFTMAX, false, 1.0, 0.01);
	c.load_balance_coeff = 1e-2;
	float *params[2];
	double losses[2][4];
	int32_t tok[4 * 24], tgt[4 * 24];
	rand_batch(tok, tgt, 4 * 24, c.vocab_size, false);
	for (int r = 0; r < 2; r++) {
		struct model m;
		const struct model_build_opts o = {.own_params = true};
		struct model_config mc;
		*moe_cfg_init(&mc) = c;
		CHECK(model_build(&m, &mc, 2, 12, &o) == CT_OK, "build");
		model_init_params(&m, 7, m.params, 0, m.table->numel);
		struct adamw opt;
		adamw_init(&opt, m.table->numel, 0.9, 0.95, 1e-8, 0.1);
		for (int s = 0; s < 4; s++) {
			struct train_step_result res;
			CHECK(train_step(&m, &opt, tok + s * 24, tgt + s * 24, 1, 3e-3, 1.0, &res) ==
			          CT_OK,
			      "step");
			losses[r][s] = res.loss;
		}
		params[r] = malloc((size_t)m.table->numel * sizeof(float));
		memcpy(params[r], m.params, (size_t)m.table->numel * sizeof(float));
		const struct moe_model *mm = m.impl;
		double moved = 0;
		for (int64_t i = 0; i < n_moe_bias(mm); i++)
			moved += fabs(mm->bias[i]);
		EXPECT(moved > 0, "the bias moved");
		if (r == 1)
			EXPECT(memcmp(params[0], params[1], (size_t)m.table->numel * sizeof(float)) ==
			               0 &&
			           memcmp(losses[0], losses[1], sizeof(losses[0])) == 0,
			       "reruns differ");
		adamw_free(&opt);
		model_free(&m);
	}
	free(params[0]), free(params[1]);
}

/* Activation checkpointing: every mode gives mode none's loss, auxiliary loss, balancing
 * counts (the recompute pass counts nothing) and gradients, bitwise, on one rank, keeps
 * fewer activation bytes, and recomputes exactly the blocks its policy names. */
TEST_CASE(test_activation_checkpointing)
{
	struct moe_config c;
	tiny_config(&c, MOE_SCORE_SOFTMAX, true, 1.5, 0.05);
	c.n_layers = 4; /* 1 dense, 3 MoE */
	int64_t B = 2, T = 12;
	const struct {
		enum model_ac ac;
		int every;
		const char *name;
	} modes[] = {{MODEL_AC_NONE, 0, "none"},
	             {MODEL_AC_FFN, 0, "ffn"},
	             {MODEL_AC_SELECTIVE, 0, "selective"},
	             {MODEL_AC_FULL, 0, "full"},
	             {MODEL_AC_LAYER, 2, "layer2"}};
	struct moe_model ref;
	const struct moe_build_opts o0 = {.own_params = true};
	CHECK(moe_build(&ref, &c, B, T, &o0) == CT_OK, "build");
	int64_t n = ref.table.numel, nb = n_moe_bias(&ref);
	moe_init_params(&ref.cfg, &ref.table, test_seed(), ref.params, 0, n);
	for (int64_t i = 0; i < nb; i++) /* a bias that changes some choices */
		ref.bias[i] = test_uniform(-0.02, 0.02);
	rand_batch(ref.tokens, ref.targets, ref.N, c.vocab_size, true);
	double *cnt0 = calloc((size_t)nb, sizeof(double)), *cnt = calloc((size_t)nb, sizeof(double));
	int64_t valid = model_count_valid(ref.targets, ref.N);
	ref.loss_dscale = 1.0 / (double)valid; /* a training step: counts kept */
	memset(ref.grads, 0, (size_t)n * sizeof(float));
	double l0 = moe_forward(&ref, NULL);
	moe_backward(&ref, ref.loss_dscale);
	moe_step_stats(&ref, cnt0);
	int64_t bytes0 = ref.act_bytes + ref.iact_bytes, prev = bytes0;
	double aux0 = 0;
	for (int l = 0; l < c.n_layers; l++)
		aux0 += ref.aux_sum[l];
	EXPECT(aux0 > 0, "the auxiliary loss is on (%g)", aux0);
	for (size_t i = 1; i < sizeof(modes) / sizeof(modes[0]); i++) {
		struct moe_model m;
		const struct moe_build_opts o = {
		    .own_params = true, .ac = modes[i].ac, .ac_every = modes[i].every};
		CHECK(moe_build(&m, &c, B, T, &o) == CT_OK, "build %s", modes[i].name);
		memcpy(m.params, ref.params, (size_t)n * sizeof(float));
		memcpy(m.bias, ref.bias, (size_t)nb * sizeof(double));
		memcpy(m.tokens, ref.tokens, (size_t)(2 * m.N) * sizeof(int32_t));
		m.loss_dscale = ref.loss_dscale;
		memset(m.grads, 0, (size_t)n * sizeof(float));
		double l = moe_forward(&m, NULL);
		moe_backward(&m, m.loss_dscale);
		moe_step_stats(&m, cnt);
		double aux = 0, c0 = 0, c1 = 0;
		for (int b = 0; b < c.n_layers; b++)
			aux += m.aux_sum[b];
		for (int64_t j = 0; j < nb; j++)
			c0 += cnt0[j], c1 += cnt[j];
		EXPECT(l == l0 && aux == aux0, "%s: loss %.9g vs %.9g, aux %.9g vs %.9g",
		       modes[i].name, l, l0, aux, aux0);
		EXPECT(memcmp(cnt, cnt0, (size_t)nb * sizeof(double)) == 0,
		       "%s: balancing counts differ from none (%g tokens counted vs %g)",
		       modes[i].name, c1, c0);
		int64_t diff = 0;
		for (int64_t j = 0; j < n; j++)
			diff += memcmp(&m.grads[j], &ref.grads[j], sizeof(float)) != 0;
		EXPECT(diff == 0, "%s: %lld of %lld gradients differ from none", modes[i].name,
		       (long long)diff, (long long)n);
		struct model mm;
		model_wrap_moe(&mm, &m);
		int recomputed = 0;
		for (int u = 0; u < mm.n_units; u++)
			recomputed += model_unit_needs_recompute(&mm, u);
		int expect = modes[i].ac == MODEL_AC_FULL || modes[i].ac == MODEL_AC_SELECTIVE
		                 ? (int)c.n_layers
		                 : modes[i].ac == MODEL_AC_LAYER ? (int)c.n_layers / 2 : 0;
		EXPECT(mm.ac == modes[i].ac && recomputed == expect,
		       "%s: %d units recompute, expected %d", modes[i].name, recomputed, expect);
		int64_t bytes = m.act_bytes + m.iact_bytes;
		fprintf(stderr, "  %-9s activations %7lld bytes (none %lld): %.2fx\n", modes[i].name,
		        (long long)bytes, (long long)bytes0, (double)bytes / (double)bytes0);
		EXPECT(bytes < bytes0, "%s: %lld activation bytes, none %lld", modes[i].name,
		       (long long)bytes, (long long)bytes0);
		if (modes[i].ac != MODEL_AC_LAYER) /* ffn > selective > full */
			EXPECT(bytes < prev, "%s keeps %lld bytes, the previous mode %lld",
			       modes[i].name, (long long)bytes, (long long)prev);
		prev = modes[i].ac != MODEL_AC_LAYER ? bytes : prev;
		moe_free(&m);
	}
	free(cnt0), free(cnt);
	moe_free(&ref);
}

/* ------------------------------------------------------------ PyTorch reference */

static void add_params(struct st_file *f, const struct param_table *t, const float *buf,
                       const char *prefix)
{
	for (int i = 0; i < t->count; i++) {
		char name[160];
		snprintf(name, sizeof(name), "%s%s", prefix, t->p[i].name);
		st_add(f, name, ST_F32, t->p[i].ndim, t->p[i].shape, buf + t->p[i].offset);
	}
}

/* S steps of training through the model interface (train_step: the bias update included)
 * on (B, T) micro-batches, written with the first step's gradients for moe_ref.py. */
static int reference_case(const struct moe_config *c, int64_t B, int64_t T, const char *dir)
{
	enum { S = 3 };
	const double lr = 3e-3, max_norm = 0.5; /* below the norms (~0.9): clipping engages */
	struct moe_model *mm = xcalloc(1, sizeof(*mm));
	const struct moe_build_opts o = {.own_params = true};
	CHECK(moe_build(mm, c, B, T, &o) == CT_OK, "build");
	struct model m;
	model_wrap_moe(&m, mm);
	int64_t n = mm->table.numel, N = mm->N, nb = n_moe_bias(mm);
	moe_init_params(&mm->cfg, &mm->table, test_seed(), mm->params, 0, n);
	int32_t *tok = malloc((size_t)(S * N) * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)(S * N) * sizeof(int32_t));
	rand_batch(tok, tgt, S * N, c->vocab_size, true);
	float *init = malloc((size_t)n * sizeof(float)), *grads = malloc((size_t)n * sizeof(float));
	memcpy(init, mm->params, (size_t)n * sizeof(float));
	memcpy(mm->tokens, tok, (size_t)N * sizeof(int32_t));
	memcpy(mm->targets, tgt, (size_t)N * sizeof(int32_t));
	int64_t valid;
	memset(mm->grads, 0, (size_t)n * sizeof(float));
	mm->loss_dscale = 0; /* not a training step: no counts */
	double loss = moe_forward(mm, &valid) / (double)valid;
	moe_backward(mm, 1.0 / (double)valid);
	memcpy(grads, mm->grads, (size_t)n * sizeof(float));

	struct lr_schedule sched;
	lr_schedule_init(&sched, lr, 1, 0.5, "linear", 0.1, S);
	struct adamw opt;
	adamw_init(&opt, n, 0.9, 0.95, 1e-8, 0.1);
	double losses[S], norms[S];
	for (int s = 0; s < S; s++) {
		struct train_step_result r;
		CHECK(train_step(&m, &opt, tok + s * N, tgt + s * N, 1, lr_schedule_at(&sched, s),
		                 max_norm, &r) == CT_OK,
		      "step");
		losses[s] = r.loss;
		norms[s] = r.grad_norm;
	}
	cJSON *cj = cJSON_CreateObject();
	const struct {
		const char *k;
		double v;
	} nums[] = {{"dim", (double)c->dim},
	            {"n_layers", (double)c->n_layers},
	            {"n_heads", (double)c->n_heads},
	            {"n_kv_heads", (double)c->n_kv_heads},
	            {"vocab_size", (double)c->vocab_size},
	            {"inter_dim", (double)c->inter_dim},
	            {"moe_inter_dim", (double)c->moe_inter_dim},
	            {"n_dense_layers", (double)c->n_dense_layers},
	            {"n_routed_experts", (double)c->n_routed_experts},
	            {"n_shared_experts", (double)c->n_shared_experts},
	            {"top_k", (double)c->top_k},
	            {"route_norm", c->route_norm ? 1.0 : 0.0},
	            {"route_scale", c->route_scale},
	            {"load_balance_coeff", c->load_balance_coeff},
	            {"aux_loss_alpha", c->aux_loss_alpha},
	            {"norm_eps", c->norm_eps},
	            {"rope_theta", c->rope_theta},
	            {"lr", lr},
	            {"beta1", 0.9},
	            {"beta2", 0.95},
	            {"eps", 1e-8},
	            {"weight_decay", 0.1},
	            {"max_norm", max_norm},
	            {"warmup_steps", 1},
	            {"steps", S},
	            {"decay_ratio", 0.5},
	            {"min_lr_factor", 0.1}};
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
		cJSON_AddNumberToObject(cj, nums[i].k, nums[i].v);
	cJSON_AddStringToObject(cj, "score_func", moe_score_name(c->score_func));
	cJSON_AddStringToObject(cj, "decay_type", "linear");
	char *cfg_json = cJSON_PrintUnformatted(cj);
	cJSON_Delete(cj);

	char path[512];
	struct st_file in, out;
	st_init(&in);
	add_params(&in, &mm->table, init, "");
	int64_t bshape[3] = {S, B, T};
	st_add(&in, "tokens", ST_I32, 3, bshape, tok);
	st_add(&in, "targets", ST_I32, 3, bshape, tgt);
	st_add_meta(&in, "config", cfg_json);
	snprintf(path, sizeof(path), "%s/inputs.safetensors", dir);
	int rc = st_write(&in, path);
	st_init(&out);
	int64_t one = 1, sdim = S;
	st_add(&out, "loss", ST_F64, 1, &one, &loss);
	st_add(&out, "losses", ST_F64, 1, &sdim, losses);
	st_add(&out, "grad_norms", ST_F64, 1, &sdim, norms);
	st_add(&out, "bias", ST_F64, 1, &nb, mm->bias);
	add_params(&out, &mm->table, grads, "grad.");
	add_params(&out, &mm->table, mm->params, "final.");
	snprintf(path, sizeof(path), "%s/outputs.safetensors", dir);
	rc |= st_write(&out, path);
	st_free(&in);
	st_free(&out);
	free(cfg_json);
	char cmd[1024];
	const char *src = getenv("CT_SOURCE_DIR");
	snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/tests/reference/moe_ref.py %s",
	         src ? src : ".", dir);
	if (rc == CT_OK)
		rc = system(cmd);
	adamw_free(&opt);
	model_free(&m); /* not owned: the wrap leaves it */
	moe_free(mm);
	free(mm), free(tok), free(tgt), free(init), free(grads);
	return rc;
}

static void reference_dir(char *dir, size_t n)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, n, "%s/ctitan-moe-ref-XXXXXX", tmp ? tmp : "/tmp");
	CHECK(mkdtemp(dir), "mkdtemp %s", dir);
}

static void remove_dir(const char *dir)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/inputs.safetensors", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/outputs.safetensors", dir);
	unlink(path);
	rmdir(dir);
}

TEST_CASE(test_reference_softmax)
{
	struct moe_config c;
	tiny_config(&c, MOE_SCORE_SOFTMAX, false, 1.0, 0.01);
	c.vocab_size = 64;
	c.n_routed_experts = 8;
	c.load_balance_coeff = 1e-2; /* large enough to change choices within 3 steps */
	char dir[256];
	reference_dir(dir, sizeof(dir));
	EXPECT(reference_case(&c, 2, 16, dir) == 0, "PyTorch reference disagrees (softmax)");
	remove_dir(dir);
}

TEST_CASE(test_reference_sigmoid)
{
	struct moe_config c;
	tiny_config(&c, MOE_SCORE_SIGMOID, true, 2.5, 0.02);
	c.vocab_size = 64;
	c.n_routed_experts = 8;
	c.top_k = 3;
	c.n_shared_experts = 2;
	c.load_balance_coeff = 1e-2;
	char dir[256];
	reference_dir(dir, sizeof(dir));
	EXPECT(reference_case(&c, 2, 16, dir) == 0, "PyTorch reference disagrees (sigmoid)");
	remove_dir(dir);
}

/* ------------------------------------------------------------ cost model */

/* The cost model's figures against a built model: the activation bytes equal what the build
 * allocates under MEM_ACTIVATIONS (one rank and ep ranks, with and without shared experts,
 * the debug preset); the matmul work of a step, per token, is 6 x the active matmul
 * parameters (the router, top_k routed and the shared experts, not all E); each MoE layer
 * under ep sends N top_k (ep - 1) / ep rows of C each way, in 3 all-to-alls forward and 2
 * backward, and a dense block none. */
TEST_CASE(test_cost_model)
{
	struct {
		const char *name;
		int64_t B, T;
		int ep, shared;
		bool debug;
	} cases[] = {{"tiny", 2, 8, 1, 1, false},       {"tiny ep 2", 2, 8, 2, 1, false},
	             {"tiny ep 4 no shared", 1, 12, 4, 0, false},
	             {"debug", 2, 16, 1, 1, true},      {"debug ep 4", 1, 16, 4, 1, true}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct model_config mc;
		struct moe_config *c = moe_cfg_init(&mc);
		if (cases[i].debug)
			CHECK(moe_config_preset(c, "deepseek_v3-debug") == CT_OK, "preset");
		else
			tiny_config(c, MOE_SCORE_SOFTMAX, false, 1.0, 0.0);
		if (cases[i].shared == 0)
			c->n_shared_experts = 0;
		EXPECT(model_cost_of(&mc) != NULL, "the deepseek_v3 family has a cost model");
		const int ep = cases[i].ep;
		const struct model_cost_shape sh = {.B = cases[i].B,
		                                    .T = cases[i].T,
		                                    .ac = MODEL_AC_NONE,
		                                    .tp = 1,
		                                    .elem_bytes = 4,
		                                    .cp = 1,
		                                    .ep = ep};
		int64_t want = model_cost_activation_bytes(&mc, &sh);
		/* ep rank 0 of ep: the build reads only the group's size and rank */
		struct model_group g = {.size = ep, .rank = 0};
		const struct moe_build_opts o = {.own_params = false, .ep = ep > 1 ? &g : NULL};
		int64_t before = mem_current(MEM_ACTIVATIONS);
		struct moe_model m;
		CHECK(moe_build(&m, c, sh.B, sh.T, &o) == CT_OK, "build %s", cases[i].name);
		int64_t got = mem_current(MEM_ACTIVATIONS) - before;
		fprintf(stderr, "  %-20s activations: cost model %lld bytes, built %lld\n",
		        cases[i].name, (long long)want, (long long)got);
		EXPECT(want == got, "%s: cost model %lld activation bytes, the built model %lld",
		       cases[i].name, (long long)want, (long long)got);
		/* matmul FLOPs of a step (forward + backward) per token */
		double mm = 0, N = (double)(sh.B * sh.T);
		for (int u = 0; u < m.table.n_units; u++) {
			model_cost_work w;
			model_cost_unit_work(&mc, &sh, u, w);
			for (int p = 0; p < MODEL_PASS_COUNT; p++)
				mm += w[p][MODEL_COST_MATMUL] + w[p][MODEL_COST_HEAD];
			EXPECT(w[MODEL_PASS_REC][MODEL_COST_MATMUL] == 0, "%s: unit %d recomputes",
			       cases[i].name, u);
			/* in the passes: the forward's row counts; the dispatch and combine are the
			 * program's nodes (posted dispatch, its wait, blocking combine), the cost
			 * model's program the model's own */
			struct model_prog f, b, pf, pb, pr, mf, mb;
			model_cost_unit_inner(&mc, &sh, u, MODEL_PASS_FWD, &f);
			model_cost_unit_inner(&mc, &sh, u, MODEL_PASS_BWD, &b);
			model_cost_unit_prog(&mc, &sh, false, u, MODEL_PASS_FWD, &pf);
			model_cost_unit_prog(&mc, &sh, false, u, MODEL_PASS_BWD, &pb);
			model_cost_unit_prog(&mc, &sh, false, u, MODEL_PASS_REC, &pr);
			moe_unit_prog(&m, u, MODEL_PASS_FWD, &mf);
			moe_unit_prog(&m, u, MODEL_PASS_BWD, &mb);
			EXPECT(memcmp(&pf, &mf, sizeof(pf)) == 0 && memcmp(&pb, &mb, sizeof(pb)) == 0,
			       "%s: unit %d: the cost model's program is the model's", cases[i].name, u);
			bool moe = u >= 1 + c->n_dense_layers && u <= c->n_layers;
			int64_t rows = sh.B * sh.T * c->top_k * (ep - 1) / ep * c->dim * 4;
			if (!moe || ep == 1) {
				EXPECT(f.n == 0 && b.n == 0 && pf.n == 0 && pb.n == 0 && pr.n == 0,
				       "%s: unit %d has %d + %d all-to-alls, programs of %d + %d + %d",
				       cases[i].name, u, f.n, b.n, pf.n, pb.n, pr.n);
				continue;
			}
			EXPECT(f.n == 1 && b.n == 0 && f.c[0].role == MODEL_GROUP_EP && f.c[0].group == ep,
			       "%s: unit %d: %d forward in-pass all-to-alls, %d backward, want 1 + 0",
			       cases[i].name, u, f.n, b.n);
			for (int k = 0; k < 2; k++) {
				const struct model_prog *q = k ? &pb : &pf;
				EXPECT(q->n == 3 && q->c[0].kind == MODEL_COLL_ALL_TO_ALL && q->c[0].post &&
				           q->c[0].bytes == rows && q->c[1].kind == MODEL_COLL_WAIT &&
				           q->c[2].kind == MODEL_COLL_ALL_TO_ALL && !q->c[2].post &&
				           q->c[2].bytes == rows && q->c[0].role == MODEL_GROUP_EP &&
				           q->c[2].group == ep && pr.n == 0,
				       "%s: unit %d: %s program of %d collectives (%lld bytes), want posted "
				       "all-to-all, wait, all-to-all of %lld",
				       cases[i].name, u, k ? "backward" : "forward", q->n,
				       (long long)(q->n ? q->c[0].bytes : 0), (long long)rows);
			}
		}
		int64_t C = c->dim, L = c->n_layers;
		double active =
		    (double)(moe_active_params(c) - c->vocab_size * C - 2 * C * L - C); /* linears */
		EXPECT(fabs(mm / N - 6.0 * active) <= 1e-9 * 6.0 * active,
		       "%s: matmul work %.6g FLOPs per token, 6 x active linear parameters %.6g",
		       cases[i].name, mm / N, 6.0 * active);
		moe_free(&m);
		/* every activation-checkpointing mode: the bytes the build allocates; recompute
		 * work only on the units that recompute, and full's all-to-alls again */
		const struct {
			enum model_ac ac;
			int every;
		} acs[] = {{MODEL_AC_FFN, 0}, {MODEL_AC_SELECTIVE, 0}, {MODEL_AC_FULL, 0},
		           {MODEL_AC_LAYER, 2}};
		for (size_t a = 0; a < sizeof(acs) / sizeof(acs[0]); a++) {
			struct model_cost_shape sa = sh;
			sa.ac = acs[a].ac;
			sa.ac_every = acs[a].every;
			int64_t wa = model_cost_activation_bytes(&mc, &sa);
			const struct moe_build_opts oa = {.own_params = false,
			                                  .ep = ep > 1 ? &g : NULL,
			                                  .ac = acs[a].ac,
			                                  .ac_every = acs[a].every};
			int64_t b0 = mem_current(MEM_ACTIVATIONS);
			struct moe_model ma;
			CHECK(moe_build(&ma, c, sa.B, sa.T, &oa) == CT_OK, "build %s", cases[i].name);
			int64_t ga = mem_current(MEM_ACTIVATIONS) - b0;
			EXPECT(wa == ga, "%s, ac %d: cost model %lld activation bytes, built %lld",
			       cases[i].name, (int)acs[a].ac, (long long)wa, (long long)ga);
			for (int u = 1; u <= c->n_layers; u++) {
				model_cost_work w;
				model_cost_unit_work(&mc, &sa, u, w);
				bool rec = model_ac_block_recomputes(sa.ac, sa.ac_every, u - 1);
				EXPECT((w[MODEL_PASS_REC][MODEL_COST_MATMUL] > 0) == rec,
				       "%s, ac %d: unit %d recompute work %g", cases[i].name,
				       (int)acs[a].ac, u, w[MODEL_PASS_REC][MODEL_COST_MATMUL]);
				struct model_prog r;
				model_cost_unit_inner(&mc, &sa, u, MODEL_PASS_REC, &r);
				bool moe = u >= 1 + c->n_dense_layers && ep > 1;
				bool full = model_ac_block(sa.ac, sa.ac_every, u - 1) == MODEL_AC_FULL;
				EXPECT(r.n == (moe && full ? 3 : 0),
				       "%s, ac %d: unit %d recompute has %d all-to-alls", cases[i].name,
				       (int)acs[a].ac, u, r.n);
			}
			moe_free(&ma);
		}
	}
}

int main(int argc, char **argv)
{
	test_seed();
#ifdef _OPENMP
	omp_set_num_threads(1); /* tiny shapes */
#endif
	bool only_ref = argc > 1 && strcmp(argv[1], "--reference") == 0;
	if (!only_ref) {
		RUN(test_table);
		RUN(test_fd_softmax_aux);
		RUN(test_fd_sigmoid_norm_aux);
		RUN(test_routing_and_float_vs_double);
		RUN(test_bias_update);
		RUN(test_determinism);
		RUN(test_cost_model);
		RUN(test_activation_checkpointing);
	}
	if (only_ref) {
		RUN(test_reference_softmax);
		RUN(test_reference_sigmoid);
	}
	return test_summary();
}
