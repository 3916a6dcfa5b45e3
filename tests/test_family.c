/* A third model family defined only here, added through the family table
 * (model_family_register), then trained by the library's one engine — FSDP's schedule
 * executor — for 5 steps on this run's ranks, and compared with the same family trained by
 * the plain one-rank reference loop (tests/testutil.c train_step) over the same global batch:
 * losses, gradient norms and the gathered parameters within 1e-5 (fp32; summation order is
 * all that differs), on every rank. Nothing outside this file knows the family.
 *
 * The family, "tinylm": tokens -> embedding (V x C) -> one residual linear mixer
 * y = x + x W^T (C x C) -> output projection (V x C) + cross-entropy. Three units (embed,
 * mixer, head), like a one-block Llama without attention. Its backward is checked against
 * finite differences of the loss in double (a mixer or head gradient that is off fails).
 *   mpiexec -n 2 build/test_family     (and -n 1)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "comm/stream.h"
#include "data/synthetic.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/param_table.h"
#include "optim/optim.h"
#include "parallel/fsdp.h"
#include "testutil.h"

/* ---------------------------------------------------------------- the family */

struct tiny_config {
	int64_t vocab, dim;
};

struct tiny_model {
	struct tiny_config cfg;
	struct param_table table;
	int64_t B, T, N;
	int32_t *tokens, *targets;
	float *params, *grads; /* own_params only */
	float *unit_w[3], *unit_dw[3];
	float *x, *y, *dy, *dx, *scratch; /* (N, C) each; scratch: the loss's logits chunk */
	double dscale;
};

enum { TINY_EMBED, TINY_MIXER, TINY_HEAD };
#define TINY_CHUNK 64

static const struct tiny_config *tiny_cfg(const struct model_config *c)
{
	return c->ext;
}

static int tiny_table(struct param_table *t, const struct model_config *c)
{
	const struct tiny_config *tc = tiny_cfg(c);
	int64_t V = tc->vocab, C = tc->dim;
	memset(t, 0, sizeof(*t));
	int cap = 0;
	struct param_init nrm = {.kind = PARAM_INIT_NORMAL, .a = 0.2};
	t->n_units = 3;
	t->unit_begin = xcalloc(4, sizeof(int64_t));
	param_table_add(t, &cap, "tok_embeddings.weight", TINY_EMBED, V, C, false, nrm);
	t->unit_begin[1] = t->numel;
	param_table_add(t, &cap, "mixer.weight", TINY_MIXER, C, C, true, nrm);
	t->unit_begin[2] = t->numel;
	param_table_add(t, &cap, "output.weight", TINY_HEAD, V, C, true, nrm);
	t->unit_begin[3] = t->numel;
	t->numel_embedding = V * C;
	return CT_OK;
}

static void tiny_init(const struct model_config *c, const struct param_table *t, uint64_t seed,
                      float *out, int64_t first, int64_t n)
{
	(void)c;
	param_table_init_range(t, seed, out, first, n);
}

static void tiny_bind(void *impl, int u, float *params, float *grads)
{
	struct tiny_model *m = impl;
	m->unit_w[u] = params;
	m->unit_dw[u] = grads;
}

static double tiny_forward(void *impl, int u, int64_t *n_valid)
{
	struct tiny_model *m = impl;
	int64_t N = m->N, C = m->cfg.dim, V = m->cfg.vocab;
	if (u == TINY_EMBED) {
		embedding_forward_f32(m->x, m->tokens, m->unit_w[u], N, C);
		return 0.0;
	}
	if (u == TINY_MIXER) { /* y = x + x W^T */
		memcpy(m->y, m->x, (size_t)(N * C) * sizeof(float));
		matmul_forward_f32(m->y, m->x, m->unit_w[u], N, C, C, 1);
		return 0.0;
	}
	int64_t valid = 0;
	double loss = cross_entropy_fused_f32(NULL, NULL, m->y, m->unit_w[u], m->targets, N, C, V,
	                                      -100, 0.0, m->scratch, TINY_CHUNK, &valid);
	if (n_valid)
		*n_valid = valid;
	return loss;
}

static void tiny_backward(void *impl, int u, double dscale)
{
	struct tiny_model *m = impl;
	int64_t N = m->N, C = m->cfg.dim, V = m->cfg.vocab, valid;
	if (u == TINY_HEAD) {
		memset(m->dy, 0, (size_t)(N * C) * sizeof(float));
		cross_entropy_fused_f32(m->dy, m->unit_dw[u], m->y, m->unit_w[u], m->targets, N, C, V,
		                        -100, dscale, m->scratch, TINY_CHUNK, &valid);
	} else if (u == TINY_MIXER) { /* dx = dy + dy W; dW += dy^T x */
		memcpy(m->dx, m->dy, (size_t)(N * C) * sizeof(float));
		matmul_backward_f32(m->dx, m->unit_dw[u], m->dy, m->x, m->unit_w[u], N, C, C);
	} else {
		embedding_backward_f32(m->unit_dw[u], m->dx, m->tokens, N, C);
	}
}

static void tiny_recompute(void *impl, int u)
{
	(void)impl, (void)u; /* everything is saved */
}
static bool tiny_needs_recompute(const void *impl, int u)
{
	(void)impl, (void)u;
	return false;
}
static void tiny_dscale(void *impl, double dscale)
{
	((struct tiny_model *)impl)->dscale = dscale;
}
static double tiny_flops(const struct model_config *c, const struct param_table *t, int64_t T)
{
	(void)c, (void)T;
	return 6.0 * (double)t->numel;
}
static void tiny_free(void *impl)
{
	struct tiny_model *m = impl;
	size_t act = (size_t)(4 * m->N * m->cfg.dim + TINY_CHUNK * m->cfg.vocab) * sizeof(float);
	mem_free(MEM_ACTIVATIONS, m->x, act);
	if (m->params) {
		mem_free(MEM_PARAMS, m->params, (size_t)m->table.numel * sizeof(float));
		mem_free(MEM_GRADS, m->grads, (size_t)m->table.numel * sizeof(float));
	}
	free(m->tokens), free(m->targets);
	param_table_free(&m->table);
}

static const struct model_ops tiny_ops = {
    .bind_unit = tiny_bind,
    .unit_forward = tiny_forward,
    .unit_backward = tiny_backward,
    .unit_recompute = tiny_recompute,
    .unit_needs_recompute = tiny_needs_recompute,
    .set_loss_dscale = tiny_dscale,
    .flops_per_token = tiny_flops,
    .free = tiny_free,
};

static int tiny_build(struct model *out, const struct model_config *c, int64_t B, int64_t T,
                      const struct model_build_opts *opts)
{
	if (opts->tp || opts->ac != MODEL_AC_NONE)
		return CT_ERR_USAGE;
	struct tiny_model *m = xcalloc(1, sizeof(*m));
	m->cfg = *tiny_cfg(c);
	tiny_table(&m->table, c);
	m->B = B, m->T = T, m->N = B * T;
	int64_t N = m->N, C = m->cfg.dim;
	m->tokens = xcalloc((size_t)N, sizeof(int32_t));
	m->targets = xcalloc((size_t)N, sizeof(int32_t));
	m->x = mem_alloc(MEM_ACTIVATIONS,
	                 (size_t)(4 * N * C + TINY_CHUNK * m->cfg.vocab) * sizeof(float));
	m->y = m->x + N * C, m->dy = m->y + N * C, m->dx = m->dy + N * C;
	m->scratch = m->dx + N * C;
	if (opts->own_params) {
		m->params = mem_alloc(MEM_PARAMS, (size_t)m->table.numel * sizeof(float));
		m->grads = mem_alloc(MEM_GRADS, (size_t)m->table.numel * sizeof(float));
		for (int u = 0; u < 3; u++)
			tiny_bind(m, u, m->params + m->table.unit_begin[u],
			          m->grads + m->table.unit_begin[u]);
	}
	memset(out, 0, sizeof(*out));
	out->cfg = *c;
	out->ops = &tiny_ops;
	out->impl = m;
	out->table = &m->table;
	out->n_units = 3;
	out->B = B, out->T = T, out->N = N;
	out->vocab_size = m->cfg.vocab;
	out->tokens = m->tokens, out->targets = m->targets;
	out->params = m->params, out->grads = m->grads;
	out->unit_w = m->unit_w, out->unit_dw = m->unit_dw;
	out->act_bytes = (4 * N * C + TINY_CHUNK * m->cfg.vocab) * (int64_t)sizeof(float);
	return CT_OK;
}

static int64_t tiny_vocab(const struct model_config *c)
{
	return tiny_cfg(c)->vocab;
}
static int64_t tiny_layers(const struct model_config *c)
{
	(void)c;
	return 1;
}
static const char *tiny_flavor(const struct model_config *c)
{
	(void)c;
	return "tiny";
}
static int64_t tiny_dim(const struct model_config *c)
{
	return tiny_cfg(c)->dim;
}
static void tiny_describe(const struct model *m, char *buf, size_t n)
{
	snprintf(buf, n, "tinylm: %lld parameters", (long long)m->table->numel);
}

static struct model_family tiny_family = {
    .name = "tinylm",
    .vocab = tiny_vocab,
    .n_layers = tiny_layers,
    .dim = tiny_dim,
    .flavor = tiny_flavor,
    .table_build = tiny_table,
    .init_params = tiny_init,
    .build = tiny_build,
    .describe = tiny_describe,
};

/* ---------------------------------------------------------------- the test */

#define B 2
#define T 24
#define STEPS 5
static const struct tiny_config tiny = {.vocab = 37, .dim = 16};
static struct mesh mesh;
static uint64_t seed;
static struct model_config cfg;

struct run {
	double loss[STEPS], norm[STEPS];
	float *params;
	int64_t numel;
};

/* The global batch of step s: dp x B rows, in the order data-parallel rank d takes them. */
static void batch(int s, int dp, int32_t *tok, int32_t *tgt)
{
	synthetic_batch(seed, tiny.vocab, (int64_t)s * dp * B, dp * B, T, tok, tgt);
}

static void run_reference(struct run *out, int dp)
{
	struct model m;
	const struct model_build_opts o = {.own_params = true};
	CHECK(model_build(&m, &cfg, B, T, &o) == CT_OK, "build the reference");
	model_init_params(&m, seed, m.params, 0, m.table->numel);
	struct adamw opt;
	adamw_init(&opt, m.table->numel, 0.9, 0.95, 1e-8, 0.1);
	int32_t *tok = xcalloc((size_t)(dp * B * T), sizeof(int32_t));
	int32_t *tgt = xcalloc((size_t)(dp * B * T), sizeof(int32_t));
	for (int s = 0; s < STEPS; s++) {
		batch(s, dp, tok, tgt);
		struct train_step_result r;
		CHECK(train_step(&m, &opt, tok, tgt, dp, 3e-2, 1.0, &r) == CT_OK, "reference step");
		out->loss[s] = r.loss, out->norm[s] = r.grad_norm;
	}
	out->numel = m.table->numel;
	out->params = xcalloc((size_t)out->numel, sizeof(float));
	memcpy(out->params, m.params, (size_t)out->numel * sizeof(float));
	free(tok), free(tgt);
	adamw_free(&opt);
	model_free(&m);
}

/* The library's engine on this run's ranks: FSDP over dp_shard, the schedule executor. */
static void run_engine(struct run *out)
{
	struct model m;
	const struct model_build_opts o = {.own_params = false};
	CHECK(model_build(&m, &cfg, B, T, &o) == CT_OK, "build through the registry");
	struct comm_stream *stream = comm_stream_create(STREAM_THREAD, 60);
	struct fsdp f;
	fsdp_build(&f, &m, &mesh, false, FSDP_RESHARD_DEFAULT, stream);
	fsdp_init_params(&f, seed);
	struct adamw opt;
	adamw_init(&opt, f.shard_numel, 0.9, 0.95, 1e-8, 0.1);
	struct engine e;
	fsdp_engine(&f, &e);
	int dp = mesh.dp_shard, d = mesh.dp_shard_rank;
	int32_t *tok = xcalloc((size_t)(dp * B * T), sizeof(int32_t));
	int32_t *tgt = xcalloc((size_t)(dp * B * T), sizeof(int32_t));
	for (int s = 0; s < STEPS; s++) {
		batch(s, dp, tok, tgt);
		struct train_step_result r;
		CHECK(engine_run(&e, tok + d * B * T, tgt + d * B * T, 1, &opt, 3e-2, 1.0, &r) ==
		          CT_OK,
		      "engine step");
		out->loss[s] = r.loss, out->norm[s] = r.grad_norm;
	}
	out->numel = m.table->numel;
	out->params = xcalloc((size_t)out->numel, sizeof(float));
	fsdp_gather_full(&f, out->params);
	free(tok), free(tgt);
	adamw_free(&opt);
	fsdp_free(&f);
	comm_stream_destroy(stream);
	model_free(&m);
}

static void test_registry(void)
{
	EXPECT(model_family_named("tinylm") == &tiny_family, "the table finds the family");
	EXPECT(strstr(model_family_list(), "tinylm") != NULL, "the family list names it: %s",
	       model_family_list());
	EXPECT(model_family_register(&tiny_family) < 0, "a second family of the same name");
	struct param_table t;
	EXPECT(model_table_build(&t, &cfg) == CT_OK && t.numel == 2 * 37 * 16 + 16 * 16,
	       "its table through the model interface");
	param_table_free(&t);
}

/* The family's own gradients against finite differences of the loss (Richardson's
 * extrapolation of two central differences, so the step's h^2 error cancels; float losses,
 * so a loose 1e-2 bound relative to max(|fd|, 0.05): a wrong gradient is off by far more). */
static double loss_at(struct model *m, int64_t i, float v)
{
	float keep = m->params[i];
	m->params[i] = v;
	double l = model_forward(m, NULL);
	m->params[i] = keep;
	return l;
}

static void test_gradients(void)
{
	struct model m;
	const struct model_build_opts o = {.own_params = true};
	CHECK(model_build(&m, &cfg, 1, 8, &o) == CT_OK, "build");
	model_init_params(&m, seed, m.params, 0, m.table->numel);
	synthetic_batch(seed, tiny.vocab, 0, 1, 8, m.tokens, m.targets);
	memset(m.grads, 0, (size_t)m.table->numel * sizeof(float));
	model_set_loss_dscale(&m, 1.0);
	model_forward(&m, NULL);
	model_backward(&m, 1.0);
	double worst = 0.0;
	for (int k = 0; k < 24; k++) {
		int64_t i = (int64_t)(test_uniform(0, 1) * (double)m.table->numel);
		double h = 2e-2, p = m.params[i];
		double d1 = (loss_at(&m, i, (float)(p + h)) - loss_at(&m, i, (float)(p - h))) / (2 * h);
		double d2 = (loss_at(&m, i, (float)(p + h / 2)) - loss_at(&m, i, (float)(p - h / 2))) / h;
		double fd = (4 * d2 - d1) / 3, g = m.grads[i];
		double err = fabs(fd - g) / fmax(fabs(fd), 0.05);
		worst = err > worst ? err : worst;
	}
	EXPECT(worst < 1e-2, "gradients vs finite differences: worst relative error %.3g", worst);
	model_free(&m);
}

static void test_engine_equals_one_rank(void)
{
	struct run ref, eng;
	run_reference(&ref, mesh.dp_shard);
	run_engine(&eng);
	double worst = 0.0;
	for (int s = 0; s < STEPS; s++) {
		worst = fmax(worst, fabs(eng.loss[s] - ref.loss[s]) / fabs(ref.loss[s]));
		worst = fmax(worst, fabs(eng.norm[s] - ref.norm[s]) / fabs(ref.norm[s]));
	}
	double p = rel_err_f32(eng.params, ref.params, ref.numel);
	EXPECT(worst < 1e-5, "%d ranks vs 1 rank: loss/grad_norm worst %.3g over %d steps",
	       mesh.world, worst, STEPS);
	EXPECT(p < 1e-5, "%d ranks vs 1 rank: parameters after %d steps %.3g", mesh.world, STEPS,
	       p);
	EXPECT(ref.loss[STEPS - 1] < ref.loss[0], "it trains: loss %.4f -> %.4f", ref.loss[0],
	       ref.loss[STEPS - 1]);
	if (mesh.rank == 0)
		fprintf(stderr, "tinylm on %d ranks: losses %.6f .. %.6f, worst %.3g, params %.3g\n",
		        mesh.world, eng.loss[0], eng.loss[STEPS - 1], worst, p);
	free(ref.params), free(eng.params);
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	CHECK(mesh_build(&mesh, 1, 1, -1, 1) == CT_OK, "mesh");
	seed = test_seed_all(&mesh.world_group);
	int kind = model_family_register(&tiny_family);
	CHECK(kind >= 0 && model_family_of((enum model_kind)kind) == &tiny_family &&
	          model_family_named("llama3") != &tiny_family,
	      "register the test family");
	cfg = (struct model_config){.kind = (enum model_kind)kind, .ext = &tiny};
	RUN(test_registry);
	RUN(test_gradients);
	RUN(test_engine_equals_one_rank);
	int rc = test_summary_all(&mesh.world_group);
	mesh_free(&mesh);
	comm_finalize();
	return rc;
}
