/* Model tests: shapes and parameter counts of every preset, init determinism, unit
 * recompute, gradient accumulation, run-to-run determinism, linear activation memory, and the
 * independent PyTorch reference (tests/reference/llama_ref.py) on random weights. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/log.h"
#include "base/mem.h"
#include "infer/generate.h"
#include "kernels/attention_bf16.h"
#include "io/safetensors.h"
#include "model/llama/llama.h"
#include "kernels/mm_engine.h"
#include "testutil.h"
#include "train/compute.h"
#include "train/lr_schedule.h"
#include "optim/optim.h"
#include "train/trainer.h"

static void rand_batch(int32_t *tok, int32_t *tgt, int64_t n, int64_t V, bool ignores)
{
	for (int64_t i = 0; i < n; i++) {
		tok[i] = (int32_t)test_uniform(0, (double)V);
		tgt[i] = (int32_t)test_uniform(0, (double)V);
		if (ignores && test_uniform(0, 1) < 0.1)
			tgt[i] = LLAMA_IGNORE_INDEX;
	}
}

TEST_CASE(test_presets)
{
	static const struct {
		const char *flavor;
		int64_t params, ffn;
	} want[] = {
	    {"debugmodel", 6163712, 768},  {"8B", 8030261248LL, 14336},
	    {"70B", 70553706496LL, 28672}, {"405B", 405853388800LL, 53248},
	    {"1B", 1498482688LL, 8192},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct llama_config c;
		struct param_table t;
		EXPECT(llama_config_preset(&c, want[i].flavor) == CT_OK, "preset %s",
		       want[i].flavor);
		llama_table_build(&t, &c);
		EXPECT(t.numel == want[i].params, "%s: %lld parameters, want %lld", want[i].flavor,
		       (long long)t.numel, (long long)want[i].params);
		EXPECT(c.ffn_hidden == want[i].ffn, "%s: ffn %lld", want[i].flavor,
		       (long long)c.ffn_hidden);
		EXPECT(t.unit_begin[t.n_units] == t.numel, "units cover the buffer");
		param_table_free(&t);
	}
	/* TorchTitan's FLOPs/token check values */
	struct llama_config c;
	struct param_table t;
	llama_config_preset(&c, "debugmodel");
	llama_table_build(&t, &c);
	double f = llama_flops_per_token(&c, &t, 2048);
	EXPECT(fabs(f - 7.159e7) < 0.001e7, "debug flops/token %.4e", f);
	param_table_free(&t);
	llama_config_preset(&c, "8B");
	llama_table_build(&t, &c);
	f = llama_flops_per_token(&c, &t, 8192);
	EXPECT(fabs(f - 5.791e10) < 0.001e10, "8B flops/token %.4e", f);
	param_table_free(&t);
	EXPECT(llama_config_preset(&c, "7B") == CT_ERR_USAGE, "unknown flavor rejected");
}

/* The init is pinned: checkpoints, the reference tests and users' runs depend on the same
 * seed giving the same weights across versions. xxh64 of the debug model's fp32 init at seed
 * 1234. */
#define LLAMA_INIT_XXH64 0x97c5ccf969fd9908ULL

TEST_CASE(test_init)
{
	struct llama_config c;
	struct param_table t;
	llama_config_preset(&c, "debugmodel");
	llama_table_build(&t, &c);
	uint64_t seed = test_seed();
	float *full = malloc((size_t)t.numel * sizeof(float));
	float *part = malloc((size_t)t.numel * sizeof(float));
	llama_init_params(&c, &t, seed, full, 0, t.numel);
	/* initialise in 3 uneven pieces, as 3 ranks would: identical bits */
	int64_t cut1 = t.numel / 3 + 17, cut2 = 2 * t.numel / 3 - 5;
	llama_init_params(&c, &t, seed, part, 0, cut1);
	llama_init_params(&c, &t, seed, part + cut1, cut1, cut2 - cut1);
	llama_init_params(&c, &t, seed, part + cut2, cut2, t.numel - cut2);
	EXPECT(memcmp(full, part, (size_t)t.numel * sizeof(float)) == 0, "sharded init differs");
	llama_init_params(&c, &t, 1234, part, 0, t.numel);
	unsigned long long h = XXH64(part, (size_t)t.numel * sizeof(float), 0);
	EXPECT(h == LLAMA_INIT_XXH64, "pinned init: xxh64 %#llx, want %#llx", h, LLAMA_INIT_XXH64);
	/* statistics */
	const struct param_entry *emb = param_table_find(&t, "tok_embeddings.weight");
	const struct param_entry *wq = param_table_find(&t, "layers.0.attention.wq.weight");
	const struct param_entry *wo = param_table_find(&t, "layers.5.attention.wo.weight");
	const struct param_entry *out = param_table_find(&t, "output.weight");
	const struct param_entry *nw = param_table_find(&t, "norm.weight");
	struct {
		const struct param_entry *p;
		double std;
	} s[] = {{emb, 1.0}, {wq, 0.02}, {wo, 0.02 / sqrt(12.0)}, {out, 1.0 / 16.0}};
	for (int i = 0; i < 4; i++) {
		double ss = 0, mx = 0;
		for (int64_t j = 0; j < s[i].p->numel; j++) {
			double x = full[s[i].p->offset + j];
			ss += x * x;
			mx = fmax(mx, fabs(x));
		}
		double std = sqrt(ss / (double)s[i].p->numel);
		EXPECT(fabs(std / s[i].std - 1) < 0.03, "%s std %.4g want ~%.4g", s[i].p->name, std,
		       s[i].std);
		if (s[i].p == out)
			EXPECT(mx <= 3 * s[i].std * (1 + 1e-6), "output truncated at 3 sigma");
	}
	EXPECT(full[nw->offset] == 1.0f && full[nw->offset + nw->numel - 1] == 1.0f, "norm ones");
	llama_init_params(&c, &t, seed + 1, part, 0, t.numel);
	EXPECT(memcmp(full, part, (size_t)t.numel * sizeof(float)) != 0, "seed changes weights");
	free(full);
	free(part);
	param_table_free(&t);
}

static void small_config(struct llama_config *c)
{
	llama_config_preset(c, "debugmodel");
	c->dim = 64;
	c->n_layers = 2;
	c->n_heads = 4;
	c->n_kv_heads = 2;
	c->vocab_size = 97;
	c->ffn_dim_multiplier = 1.3;
	c->multiple_of = 32;
	c->rope_scaling = true;
	c->rope_original_ctx = 16; /* small context so the 3.1 scaling bands all apply */
	llama_config_finish(c);
}

TEST_CASE(test_recompute)
{
	struct llama_config c;
	small_config(&c);
	struct llama_model m;
	EXPECT(llama_build(&m, &c, 2, 19) == CT_OK, "build");
	llama_init_params(&m.cfg, &m.table, test_seed(), m.params, 0, m.table.numel);
	rand_batch(m.tokens, m.targets, m.N, c.vocab_size, true);
	double loss = llama_forward(&m, NULL);
	char *saved = malloc((size_t)m.act_bytes);
	memcpy(saved, m.tokens, (size_t)m.act_bytes);
	for (int u = m.table.n_units - 1; u >= 0; u--)
		llama_unit_recompute(&m, u);
	EXPECT(memcmp(saved, m.tokens, (size_t)m.act_bytes) == 0, "recompute is not bitwise");
	EXPECT(llama_forward(&m, NULL) == loss, "forward is deterministic");
	free(saved);
	llama_free(&m);
}

/* Run `steps` train steps; returns losses and leaves params in m. */
static void run_steps(struct llama_model *m, int steps, int64_t accum, const int32_t *tok,
                      const int32_t *tgt, double *losses, double *norms)
{
	struct adamw opt;
	struct model mm;
	model_wrap_llama(&mm, m);
	adamw_init(&opt, m->table.numel, 0.9, 0.95, 1e-8, 0.1);
	for (int s = 0; s < steps; s++) {
		struct train_step_result r;
		int64_t off = (int64_t)s * accum * m->N;
		EXPECT(train_step(&mm, &opt, tok + off, tgt + off, accum, 1e-3, 1.0, &r) == CT_OK,
		       "step");
		losses[s] = r.loss;
		norms[s] = r.grad_norm;
	}
	adamw_free(&opt);
}

TEST_CASE(test_accumulation_and_determinism)
{
	struct llama_config c;
	small_config(&c);
	int64_t T = 23, steps = 3;
	int32_t *tok = malloc((size_t)(steps * 4 * T) * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)(steps * 4 * T) * sizeof(int32_t));
	rand_batch(tok, tgt, steps * 4 * T, c.vocab_size, true);
	uint64_t seed = test_seed();
	struct llama_model a, b, d;
	double la[3], lb[3], ld[3], na[3], nb[3], nd[3];
	llama_build(&a, &c, 4, T); /* one micro-batch of 4 */
	llama_build(&b, &c, 2, T); /* two micro-batches of 2 */
	llama_build(&d, &c, 4, T); /* a rerun of a */
	llama_init_params(&a.cfg, &a.table, seed, a.params, 0, a.table.numel);
	memcpy(b.params, a.params, (size_t)a.table.numel * sizeof(float));
	memcpy(d.params, a.params, (size_t)a.table.numel * sizeof(float));
	run_steps(&a, 3, 1, tok, tgt, la, na);
	run_steps(&b, 3, 2, tok, tgt, lb, nb);
	run_steps(&d, 3, 1, tok, tgt, ld, nd);
	for (int s = 0; s < 3; s++) {
		EXPECT(fabs(la[s] - lb[s]) < 1e-5 * la[s], "step %d: loss %.8g vs accum %.8g", s,
		       la[s], lb[s]);
		EXPECT(fabs(na[s] - nb[s]) < 1e-4 * na[s], "step %d: norm %.8g vs accum %.8g", s,
		       na[s], nb[s]);
		EXPECT(la[s] == ld[s] && na[s] == nd[s], "rerun not bitwise identical");
	}
	EXPECT(rel_err_f32(b.params, a.params, a.table.numel) < 1e-5, "accumulated params");
	EXPECT(memcmp(a.params, d.params, (size_t)a.table.numel * sizeof(float)) == 0,
	       "rerun params not bitwise identical");
	llama_free(&a);
	llama_free(&b);
	llama_free(&d);
	free(tok);
	free(tgt);
}

TEST_CASE(test_recompute_ffn_bitwise)
{
	/* Recomputing the FFN up-projections in backward gives bitwise the same gradients. */
	struct llama_config c;
	small_config(&c);
	struct llama_model a, b;
	const struct llama_build_opts ra = {.own_params = true, .recompute_ffn = false};
	const struct llama_build_opts rb = {.own_params = true, .recompute_ffn = true};
	llama_build_ex(&a, &c, 2, 21, &ra);
	llama_build_ex(&b, &c, 2, 21, &rb);
	EXPECT(b.act_bytes < a.act_bytes, "recompute_ffn saves memory");
	llama_init_params(&a.cfg, &a.table, test_seed(), a.params, 0, a.table.numel);
	memcpy(b.params, a.params, (size_t)a.table.numel * sizeof(float));
	rand_batch(a.tokens, a.targets, a.N, c.vocab_size, true);
	memcpy(b.tokens, a.tokens, (size_t)a.N * sizeof(int32_t));
	memcpy(b.targets, a.targets, (size_t)a.N * sizeof(int32_t));
	double la = llama_forward(&a, NULL), lb = llama_forward(&b, NULL);
	llama_backward(&a, 0.01);
	llama_backward(&b, 0.01);
	EXPECT(la == lb, "loss differs");
	EXPECT(memcmp(a.grads, b.grads, (size_t)a.table.numel * sizeof(float)) == 0,
	       "gradients differ");
	llama_free(&a);
	llama_free(&b);
}

TEST_CASE(test_generate_kv_cache)
{
	/* Decoding one token at a time with the KV cache gives, at every position, the logits of
	 * the full training forward over the same sequence. */
	struct llama_config c;
	small_config(&c);
	int64_t T = 19;
	struct llama_model m;
	llama_build(&m, &c, 1, T);
	llama_init_params(&m.cfg, &m.table, test_seed(), m.params, 0, m.table.numel);
	rand_batch(m.tokens, m.targets, T, c.vocab_size, false);
	float *full = malloc((size_t)(T * c.vocab_size) * sizeof(float));
	llama_logits(&m, full);
	struct gen_state *g = gen_create(&m.cfg, &m.table, m.params, T + 8);
	double worst = 0;
	for (int64_t t = 0; t < T; t++) {
		const float *lg = gen_step(g, m.tokens[t]);
		double e = rel_err_f32(lg, full + t * c.vocab_size, c.vocab_size);
		worst = e > worst ? e : worst;
	}
	EXPECT(worst < 1e-5, "decode logits vs full forward: rel err %.3e", worst);
	gen_free(g);
	/* greedy is deterministic; sampling is reproducible for a seed */
	int32_t a[8], b[8];
	struct gen_opts o = {
	    .max_new_tokens = 8, .temperature = 0, .top_k = 0, .seed = 1, .stop_id = -1};
	for (int k = 0; k < 2; k++) {
		struct gen_opts oo = o;
		oo.temperature = k ? 0.8 : 0;
		oo.top_k = k ? 5 : 0;
		oo.top_p = k ? 0.9 : 0;
		g = gen_create(&m.cfg, &m.table, m.params, T + 8);
		int64_t na = gen_generate(g, m.tokens, 4, &oo, a);
		gen_free(g);
		g = gen_create(&m.cfg, &m.table, m.params, T + 8);
		int64_t nb = gen_generate(g, m.tokens, 4, &oo, b);
		gen_free(g);
		EXPECT(na == 8 && nb == 8 && memcmp(a, b, sizeof(a)) == 0,
		       "generation reproducible");
	}
	/* a tiny nucleus keeps only the most likely token: sampling becomes greedy */
	struct gen_opts greedy = o, nucleus = o;
	nucleus.temperature = 1.0;
	nucleus.top_p = 1e-9;
	g = gen_create(&m.cfg, &m.table, m.params, T + 8);
	gen_generate(g, m.tokens, 4, &greedy, a);
	gen_free(g);
	g = gen_create(&m.cfg, &m.table, m.params, T + 8);
	gen_generate(g, m.tokens, 4, &nucleus, b);
	gen_free(g);
	EXPECT(memcmp(a, b, sizeof(a)) == 0, "top_p -> 0 is not greedy");
	free(full);
	llama_free(&m);
}

TEST_CASE(test_overfit_one_batch)
{
	/* Training repeatedly on one batch must drive its loss down. */
	struct llama_config c;
	small_config(&c);
	struct llama_model m;
	llama_build(&m, &c, 2, 16);
	llama_init_params(&m.cfg, &m.table, test_seed(), m.params, 0, m.table.numel);
	int32_t tok[32], tgt[32];
	rand_batch(tok, tgt, 32, c.vocab_size, false);
	struct adamw opt;
	struct model mm;
	model_wrap_llama(&mm, &m);
	adamw_init(&opt, m.table.numel, 0.9, 0.95, 1e-8, 0.0);
	double first = 0, last = 0;
	for (int s = 0; s < 20; s++) {
		struct train_step_result r;
		train_step(&mm, &opt, tok, tgt, 1, 3e-3, 1.0, &r);
		if (s == 0)
			first = r.loss;
		last = r.loss;
	}
	EXPECT(last < 0.5 * first, "loss %.4f -> %.4f after 20 steps on one batch", first, last);
	adamw_free(&opt);
	llama_free(&m);
}

TEST_CASE(test_activation_memory_linear)
{
	/* Saved activations + scratch of the debug model at B=1: strictly linear in T, because
	 * attention keeps only an O(T) log-sum-exp per head (no T x T scores). */
	struct llama_config c;
	llama_config_preset(&c, "debugmodel");
	int64_t bytes[3], Ts[3] = {512, 1024, 2048};
	for (int i = 0; i < 3; i++) {
		struct llama_model m;
		llama_build(&m, &c, 1, Ts[i]);
		bytes[i] = m.act_bytes + m.scratch_bytes - m.ce_rows * c.vocab_size * 4;
		fprintf(stderr, "  debugmodel T=%lld: activations+scratch %.2f MiB\n",
		        (long long)Ts[i], (double)(m.act_bytes + m.scratch_bytes) / 1048576.0);
		llama_free(&m);
	}
	double r1 = (double)bytes[1] / (double)bytes[0], r2 = (double)bytes[2] / (double)bytes[1];
	EXPECT(fabs(r1 - 2) < 0.01 && fabs(r2 - 2) < 0.01, "not linear: ratios %.4f %.4f", r1, r2);
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

/* bf16 compute (--bf16): the tolerances passed to llama_ref.py (see main). */
static bool ref_bf16;
static const char *ref_tols = "";

static int reference_case(const struct llama_config *c, int64_t B, int64_t T, const char *dir)
{
	const int S = 10;
	const double lr = 3e-3, max_norm = 0.5;
	struct llama_model m;
	CHECK(llama_build(&m, c, B, T) == CT_OK, "build");
	llama_init_params(&m.cfg, &m.table, test_seed(), m.params, 0, m.table.numel);
	int64_t N = m.N, V = c->vocab_size;
	int32_t *tok = malloc((size_t)(S * N) * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)(S * N) * sizeof(int32_t));
	rand_batch(tok, tgt, S * N, V, true);
	float *init = malloc((size_t)m.table.numel * sizeof(float));
	memcpy(init, m.params, (size_t)m.table.numel * sizeof(float));

	/* batch 0 at the initial weights: logits, loss, gradients */
	float *logits = malloc((size_t)(N * V) * sizeof(float));
	memcpy(m.tokens, tok, (size_t)N * sizeof(int32_t));
	memcpy(m.targets, tgt, (size_t)N * sizeof(int32_t));
	struct model mm;
	model_wrap_llama(&mm, &m);
	if (ref_bf16) /* bf16 parameters, as the trainer computes with (train_step) */
		compute_bind_bf16_params(&mm, true);
	llama_logits(&m, logits);
	int64_t valid;
	memset(m.grads, 0, (size_t)m.table.numel * sizeof(float));
	m.loss_dscale = 0;
	double loss = llama_forward(&m, &valid) / (double)valid;
	llama_backward(&m, 1.0 / (double)valid);
	if (ref_bf16)
		compute_bind_bf16_params(&mm, false);
	float *grads = malloc((size_t)m.table.numel * sizeof(float));
	memcpy(grads, m.grads, (size_t)m.table.numel * sizeof(float));

	/* S steps with warmup + cosine decay, clipping, AdamW */
	struct lr_schedule sched;
	lr_schedule_init(&sched, lr, 3, 0.5, "cosine", 0.1, S);
	struct adamw opt;
	adamw_init(&opt, m.table.numel, 0.9, 0.95, 1e-8, 0.1);
	double losses[10];
	int clipped = 0;
	for (int s = 0; s < S; s++) {
		struct train_step_result r;
		CHECK(train_step(&mm, &opt, tok + s * N, tgt + s * N, 1, lr_schedule_at(&sched, s),
		                 max_norm, &r) == CT_OK,
		      "step");
		losses[s] = r.loss;
		clipped += r.grad_norm > max_norm;
	}
	EXPECT(clipped > 0, "clipping never engaged: the test would not cover it");

	cJSON *cj = cJSON_CreateObject();
	cJSON_AddNumberToObject(cj, "dim", (double)c->dim);
	cJSON_AddNumberToObject(cj, "n_layers", (double)c->n_layers);
	cJSON_AddNumberToObject(cj, "n_heads", (double)c->n_heads);
	cJSON_AddNumberToObject(cj, "n_kv_heads", (double)c->n_kv_heads);
	cJSON_AddNumberToObject(cj, "ffn_hidden", (double)m.cfg.ffn_hidden);
	cJSON_AddNumberToObject(cj, "vocab_size", (double)V);
	cJSON_AddNumberToObject(cj, "norm_eps", c->norm_eps);
	cJSON_AddNumberToObject(cj, "rope_theta", c->rope_theta);
	cJSON_AddBoolToObject(cj, "rope_scaling", c->rope_scaling);
	cJSON_AddNumberToObject(cj, "rope_factor", c->rope_factor);
	cJSON_AddNumberToObject(cj, "rope_low_freq_factor", c->rope_low_freq_factor);
	cJSON_AddNumberToObject(cj, "rope_high_freq_factor", c->rope_high_freq_factor);
	cJSON_AddNumberToObject(cj, "rope_original_ctx", (double)c->rope_original_ctx);
	cJSON_AddNumberToObject(cj, "lr", lr);
	cJSON_AddNumberToObject(cj, "beta1", 0.9);
	cJSON_AddNumberToObject(cj, "beta2", 0.95);
	cJSON_AddNumberToObject(cj, "eps", 1e-8);
	cJSON_AddNumberToObject(cj, "weight_decay", 0.1);
	cJSON_AddNumberToObject(cj, "max_norm", max_norm);
	cJSON_AddNumberToObject(cj, "warmup_steps", 3);
	cJSON_AddNumberToObject(cj, "steps", S);
	cJSON_AddStringToObject(cj, "decay_type", "cosine");
	cJSON_AddNumberToObject(cj, "decay_ratio", 0.5);
	cJSON_AddNumberToObject(cj, "min_lr_factor", 0.1);
	char *cfg_json = cJSON_PrintUnformatted(cj);
	cJSON_Delete(cj);

	char path[512];
	struct st_file in, out;
	st_init(&in);
	add_params(&in, &m.table, init, "");
	int64_t bshape[3] = {S, B, T};
	st_add(&in, "tokens", ST_I32, 3, bshape, tok);
	st_add(&in, "targets", ST_I32, 3, bshape, tgt);
	st_add_meta(&in, "config", cfg_json);
	snprintf(path, sizeof(path), "%s/inputs.safetensors", dir);
	int rc = st_write(&in, path);
	st_init(&out);
	int64_t lshape[3] = {B, T, V}, one = 1, sdim = S;
	st_add(&out, "logits", ST_F32, 3, lshape, logits);
	st_add(&out, "loss", ST_F64, 1, &one, &loss);
	st_add(&out, "losses", ST_F64, 1, &sdim, losses);
	add_params(&out, &m.table, grads, "grad.");
	add_params(&out, &m.table, m.params, "final.");
	snprintf(path, sizeof(path), "%s/outputs.safetensors", dir);
	rc |= st_write(&out, path);
	st_free(&in);
	st_free(&out);
	free(cfg_json);

	char cmd[1024];
	const char *src = getenv("CT_SOURCE_DIR");
	snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/tests/reference/llama_ref.py %s %s",
	         src ? src : ".", dir, ref_tols);
	if (rc == CT_OK)
		rc = system(cmd);
	adamw_free(&opt);
	llama_free(&m);
	free(tok), free(tgt), free(init), free(logits), free(grads);
	return rc;
}

static void reference_dir(char *dir, size_t n)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, n, "%s/ctitan-ref-XXXXXX", tmp ? tmp : "/tmp");
	CHECK(mkdtemp(dir), "mkdtemp");
}

static void remove_dir(const char *dir)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/inputs.safetensors", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/outputs.safetensors", dir);
	unlink(p);
	rmdir(dir);
}

TEST_CASE(test_reference_small_gqa)
{
	/* GQA, odd vocab and T, head dim 16, FFN multiplier, Llama 3.1 RoPE scaling */
	struct llama_config c;
	small_config(&c);
	char dir[512];
	reference_dir(dir, sizeof(dir));
	EXPECT(reference_case(&c, 2, 37, dir) == 0, "PyTorch reference disagrees (small GQA)");
	remove_dir(dir);
}

TEST_CASE(test_reference_debugmodel)
{
	struct llama_config c;
	llama_config_preset(&c, "debugmodel");
	char dir[512];
	reference_dir(dir, sizeof(dir));
	EXPECT(reference_case(&c, 2, 64, dir) == 0, "PyTorch reference disagrees (debugmodel)");
	remove_dir(dir);
}

/* Head dim 32: under bf16 compute the attention runs the bf16 kernel (kernels/attention_bf16.h,
 * on CPUs with AVX512-BF16; D = 16 above stays on the fp32 one), within the same bounds. */
TEST_CASE(test_reference_head_dim_32)
{
	struct llama_config c;
	small_config(&c);
	c.dim = 128;
	llama_config_finish(&c);
	if (ref_bf16)
		printf("  attention kernel at head dim %lld: %s\n", (long long)(c.dim / c.n_heads),
		       attention_mixed_name(c.dim / c.n_heads));
	char dir[512];
	reference_dir(dir, sizeof(dir));
	EXPECT(reference_case(&c, 2, 70, dir) == 0, "PyTorch reference disagrees (head dim 32)");
	remove_dir(dir);
}

int main(int argc, char **argv)
{
	test_seed();
	bool only_ref = argc > 1 && strcmp(argv[1], "--reference") == 0;
	/* --bf16: the model with bf16 matmul operands (fp32 accumulation) and bf16 parameters
	 * against the float64 reference. Tolerances from bf16 rounding, u = 2^-9 (round to
	 * nearest even; fp32's is 2^-24): each matmul operand carries a relative error <= u, so
	 * a matmul's output is off by ~u relative (random signs: sqrt(2/3) u in L2) and the
	 * layers' errors add up. Logits: 4u (measured ~1.5u). Loss and the 10 training losses:
	 * u (a mean over all tokens, where the errors average out; measured <= 0.1u).
	 * Gradients: 16u (backward runs twice the matmuls and, through RMSNorm and softmax,
	 * ratios of small numbers; measured <= 3u). Final weights after 10 AdamW steps: 4e-2,
	 * about a quarter of one AdamW step per element (lr 3e-3 on weights of RMS ~0.02): Adam
	 * normalises each element's step, so an element whose gradient is below the bf16 noise
	 * moves by up to lr either way (measured 1.3e-2). */
	if (argc > 1 && strcmp(argv[1], "--bf16") == 0) {
		ref_bf16 = only_ref = true;
		mm_engine_configure(MM_ENGINE_AUTO, MM_BF16);
		ref_tols =
		    "--tol-logits 7.8e-3 --tol-loss 2e-3 --tol-grad 3.1e-2 --tol-losses 2e-3 "
		    "--tol-final 4e-2";
	}
	if (!only_ref) {
		RUN(test_presets);
		RUN(test_init);
		RUN(test_recompute);
		RUN(test_accumulation_and_determinism);
		RUN(test_overfit_one_batch);
		RUN(test_recompute_ffn_bitwise);
		RUN(test_generate_kv_cache);
		RUN(test_activation_memory_linear);
	}
	if (only_ref || (argc > 1 && strcmp(argv[1], "--all") == 0)) {
		RUN(test_reference_small_gqa);
		RUN(test_reference_debugmodel);
		RUN(test_reference_head_dim_32);
	}
	return test_summary();
}
