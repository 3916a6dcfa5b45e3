/* The deepseek_v3 (mixture-of-experts) family behind the model interface (model/model.h):
 * its operations, its entry of the family table, its [model] keys, and what it supports
 * (one rank, FSDP and expert parallelism inside it, pipeline stages with both; every
 * activation-checkpointing mode; the cost model; Hugging Face export and import with
 * DeepSeek-V3's names (moe_hf.c); float8 dense linears; no TP or MLA yet). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/config.h"
#include "model/family.h"
#include "model/model_group.h"
#include "model/moe/moe.h"
#include "model/moe/moe_cost.h"

/* This family's entry of the table (below; model/model.c lists it). */
extern const struct model_family moe_family;
/* its Hugging Face format (moe_hf.c) */
extern const struct model_hf_ops moe_hf_ops;

/* ---------------------------------------------------------------- its config */

_Static_assert(sizeof(struct moe_config) <= MODEL_CONFIG_BYTES &&
                   _Alignof(struct moe_config) <= _Alignof(max_align_t),
               "a moe_config fits a model_config");

struct moe_config *moe_cfg_mut(struct model_config *mc)
{
	CHECK(mc->kind == model_family_kind(&moe_family), "model: a %s config read as %s",
	      model_kind_name(mc->kind), moe_family.name);
	return (struct moe_config *)(void *)mc->family;
}

const struct moe_config *moe_cfg(const struct model_config *mc)
{
	return moe_cfg_mut((struct model_config *)mc);
}

struct moe_config *moe_cfg_init(struct model_config *mc)
{
	memset(mc, 0, sizeof(*mc));
	mc->kind = model_family_kind(&moe_family);
	return (struct moe_config *)(void *)mc->family;
}

/* ---------------------------------------------------------------- operations */

static void moe_op_bind(void *impl, int u, float *params, float *grads)
{
	moe_bind_unit(impl, u, params, grads);
	struct moe_model *m = impl;
	model_fp8_bind(&m->table, u, params, NULL, NULL);
}
static double moe_op_forward(void *impl, int u, int64_t *n_valid)
{
	return moe_unit_forward(impl, u, n_valid);
}
static void moe_op_backward(void *impl, int u, double dscale)
{
	moe_unit_backward(impl, u, dscale);
}
static void moe_op_recompute(void *impl, int u)
{
	moe_unit_recompute(impl, u);
}
static bool moe_op_needs_recompute(const void *impl, int u)
{
	return moe_unit_needs_recompute(impl, u);
}
static void moe_op_prog(const void *impl, int u, enum model_pass p, struct model_prog *out)
{
	moe_unit_prog(impl, u, p, out);
}
static double moe_op_unit_op(void *impl, int u, enum model_pass p, int op, double dscale,
                             bool *ran)
{
	return moe_unit_op(impl, u, p, op, dscale, ran);
}
static void moe_op_dscale(void *impl, double dscale)
{
	((struct moe_model *)impl)->loss_dscale = dscale;
}
static void moe_op_logits(void *impl, float *logits)
{
	moe_logits(impl, logits);
}
static double moe_op_flops(const struct model_config *c, const struct param_table *t,
                           int64_t seq_len)
{
	(void)t;
	return moe_flops_per_token(moe_cfg(c), seq_len);
}
static int64_t moe_op_step_stats(void *impl, double *out)
{
	return moe_step_stats(impl, out);
}
static void moe_op_after_step(void *impl, const double *sum)
{
	moe_after_step(impl, sum);
}
/* the balancing bias (MoE layers x routed experts): the state a checkpoint holds */
static int64_t moe_op_state(const void *impl, double *out)
{
	const struct moe_model *m = impl;
	int64_t n = (m->cfg.n_layers - m->cfg.n_dense_layers) * m->cfg.n_routed_experts;
	if (out && n > 0)
		memcpy(out, m->bias, (size_t)n * sizeof(double));
	return n;
}
static void moe_op_set_state(void *impl, const double *in, int64_t n)
{
	struct moe_model *m = impl;
	CHECK(n == moe_op_state(m, NULL), "moe: a state of %lld doubles", (long long)n);
	if (n > 0)
		memcpy(m->bias, in, (size_t)n * sizeof(double));
}
/* the residual stream between units: unit u's output is block u's input (x_final after the
 * last block); the gradient buffer the units' backwards pass down (a pipeline stage's
 * boundaries) */
static float *moe_op_unit_output(void *impl, int u)
{
	struct moe_model *m = impl;
	CHECK(u >= 0 && u <= m->cfg.n_layers &&
	          (m->unit_hi <= 0 || (u >= m->unit_lo - 1 && u <= m->unit_hi - 1)),
	      "moe: unit %d has no residual output in units [%d, %d)", u, m->unit_lo, m->unit_hi);
	return (float *)m->acts + (u < m->cfg.n_layers ? m->blk[u].x : m->x_final);
}
static float *moe_op_residual_grad(void *impl)
{
	struct moe_model *m = impl;
	return (float *)m->scratch + m->s_dres;
}
static int moe_op_step_metrics(const void *impl, struct model_step_metric *out, int max)
{
	return moe_step_metrics(impl, out, max);
}
static void moe_op_free(void *impl)
{
	moe_free(impl);
}

static const struct model_ops moe_ops = {
    .bind_unit = moe_op_bind,
    .unit_forward = moe_op_forward,
    .unit_backward = moe_op_backward,
    .unit_recompute = moe_op_recompute,
    .unit_needs_recompute = moe_op_needs_recompute,
    .unit_prog = moe_op_prog,
    .unit_op = moe_op_unit_op,
    .set_loss_dscale = moe_op_dscale,
    .logits = moe_op_logits,
    .unit_output = moe_op_unit_output,
    .residual_grad = moe_op_residual_grad,
    .flops_per_token = moe_op_flops,
    .step_stats = moe_op_step_stats,
    .after_step = moe_op_after_step,
    .step_metrics = moe_op_step_metrics,
    .state = moe_op_state,
    .set_state = moe_op_set_state,
    .free = moe_op_free,
};

void model_wrap_moe(struct model *m, struct moe_model *mm)
{
	CHECK(!mm->f64, "model: the trainer runs float models");
	memset(m, 0, sizeof(*m));
	*moe_cfg_init(&m->cfg) = mm->cfg;
	m->ops = &moe_ops;
	m->impl = mm;
	m->table = &mm->table;
	m->ac = mm->ac;
	m->ac_every = mm->ac_every;
	m->n_units = mm->table.n_units;
	m->B = mm->B;
	m->T = mm->T;
	m->N = mm->N;
	m->vocab_size = mm->cfg.vocab_size;
	m->tokens = mm->tokens;
	m->targets = mm->targets;
	m->params = mm->params;
	m->grads = mm->grads;
	m->unit_w = mm->unit_w;
	m->unit_dw = mm->unit_dw;
	m->act_bytes = mm->act_bytes;
	m->scratch_bytes = mm->scratch_bytes;
}

static int moe_family_build(struct model *m, const struct model_config *c, int64_t B, int64_t T,
                            const struct model_build_opts *opts)
{
	if (opts->tp && opts->tp->size > 1) {
		LOG_ERROR("parallelism.tensor_parallel_degree = %d: not yet supported for "
		          "model.name = \"deepseek_v3\" (the experts and heads are not split)",
		          opts->tp->size);
		return CT_ERR_USAGE;
	}
	/* a split backward (zero-bubble pipelines): no deferred weight gradients yet, so a
	 * block's whole backward runs in its I action and W has nothing to do (as Hyena's) */
	struct moe_model *mm = xcalloc(1, sizeof(*mm));
	const struct moe_build_opts mo = {.own_params = opts->own_params,
	                                  .ep = opts->ep,
	                                  .ac = opts->recompute_ffn ? MODEL_AC_FFN : opts->ac,
	                                  .ac_every = opts->ac_every,
	                                  .unit_lo = opts->unit_lo,
	                                  .unit_hi = opts->unit_hi};
	int rc = moe_build(mm, moe_cfg(c), B, T, &mo);
	if (rc) {
		free(mm);
		return rc;
	}
	model_wrap_moe(m, mm);
	return CT_OK;
}

static void moe_describe(const struct model *m, char *buf, size_t n)
{
	const struct moe_config *c = moe_cfg(&m->cfg);
	const struct moe_model *mm = m->impl;
	int64_t total = m->table->numel, mine = 0; /* under ep the table holds this rank's experts */
	for (int i = 0; i < m->table->count; i++)
		mine += m->table->p[i].expert ? m->table->p[i].numel : 0;
	total += (int64_t)(mm->ep - 1) * mine;
	char ep[64] = "";
	if (mm->ep > 1)
		snprintf(ep, sizeof(ep), "; ep rank %d/%d: experts %lld-%lld",
		         mm->ep_rank, mm->ep, (long long)(mm->ep_rank * mm->E_local),
		         (long long)((mm->ep_rank + 1) * mm->E_local - 1));
	snprintf(buf, n,
	         "deepseek_v3 %s: %lld parameters, %lld active (dim %lld, %lld layers of which "
	         "%lld dense, %lld heads, %lld kv heads, %lld routed experts top-%lld + %lld "
	         "shared, expert ffn %lld, %s scores, vocab %lld; GQA attention%s)",
	         c->flavor, (long long)total, (long long)moe_active_params(c),
	         (long long)c->dim, (long long)c->n_layers, (long long)c->n_dense_layers,
	         (long long)c->n_heads, (long long)c->n_kv_heads, (long long)c->n_routed_experts,
	         (long long)c->top_k, (long long)c->n_shared_experts, (long long)c->moe_inter_dim,
	         moe_score_name(c->score_func), (long long)c->vocab_size, ep);
}

static int64_t moe_family_vocab(const struct model_config *c)
{
	return moe_cfg(c)->vocab_size;
}
static int64_t moe_family_layers(const struct model_config *c)
{
	return moe_cfg(c)->n_layers;
}
static int64_t moe_family_dim(const struct model_config *c)
{
	return moe_cfg(c)->dim;
}
static const char *moe_family_flavor(const struct model_config *c)
{
	return moe_cfg(c)->flavor;
}
static int moe_family_table(struct param_table *t, const struct model_config *c)
{
	return moe_table_build(t, moe_cfg(c));
}
static int moe_family_table_ep(struct param_table *t, const struct model_config *c, int ep,
                               int ep_rank)
{
	if (moe_cfg(c)->n_routed_experts % ep) {
		LOG_ERROR("parallelism.expert_parallel_degree = %d does not divide "
		          "model.moe_n_routed_experts = %lld",
		          ep, (long long)moe_cfg(c)->n_routed_experts);
		return CT_ERR_USAGE;
	}
	return moe_table_build_ep(t, moe_cfg(c), ep, ep_rank);
}
static void moe_family_init(const struct model_config *c, const struct param_table *t,
                            uint64_t seed, float *out, int64_t first, int64_t n)
{
	moe_init_params(moe_cfg(c), t, seed, out, first, n);
}

static void moe_manifest_fields(const struct model_config *mc, cJSON *o)
{
	const struct moe_config *c = moe_cfg(mc);
	cJSON_AddStringToObject(o, "flavor", c->flavor);
	cJSON_AddNumberToObject(o, "dim", (double)c->dim);
	cJSON_AddNumberToObject(o, "n_layers", (double)c->n_layers);
	cJSON_AddNumberToObject(o, "n_heads", (double)c->n_heads);
	cJSON_AddNumberToObject(o, "n_kv_heads", (double)c->n_kv_heads);
	cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
	cJSON_AddNumberToObject(o, "inter_dim", (double)c->inter_dim);
	cJSON_AddNumberToObject(o, "moe_inter_dim", (double)c->moe_inter_dim);
	cJSON_AddNumberToObject(o, "n_dense_layers", (double)c->n_dense_layers);
	cJSON_AddNumberToObject(o, "n_routed_experts", (double)c->n_routed_experts);
	cJSON_AddNumberToObject(o, "n_shared_experts", (double)c->n_shared_experts);
	cJSON_AddNumberToObject(o, "top_k", (double)c->top_k);
	cJSON_AddStringToObject(o, "score_func", moe_score_name(c->score_func));
	cJSON_AddBoolToObject(o, "route_norm", c->route_norm);
	cJSON_AddNumberToObject(o, "route_scale", c->route_scale);
	cJSON_AddNumberToObject(o, "load_balance_coeff", c->load_balance_coeff);
	cJSON_AddNumberToObject(o, "aux_loss_alpha", c->aux_loss_alpha);
	cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps);
	cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
}

/* ---------------------------------------------------------------- run configuration */

/* deepseek_v3's own `[model]` keys (-1 / "preset": the flavor's value). */
static const struct config_key_def moe_keys[] = {
    {.name = "moe_n_routed_experts", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(1),
     .help = "deepseek_v3: routed experts per MoE layer; -1: the flavor's."},
    {.name = "moe_n_shared_experts", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(0),
     .help = "deepseek_v3: always-on shared experts (one SwiGLU of their summed width); -1: "
             "the flavor's."},
    {.name = "moe_top_k", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(1),
     .help = "deepseek_v3: experts each token is routed to; -1: the flavor's."},
    {.name = "moe_n_dense_layers", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(0),
     .help = "deepseek_v3: leading blocks with a dense FFN instead of experts; -1: the "
             "flavor's."},
    {.name = "moe_score_func", .type = CONFIG_STRING, .def = "preset",
     CONFIG_CHOICES("preset", "softmax", "sigmoid"),
     .help = "deepseek_v3: the router's score function; preset: the flavor's."},
    {.name = "moe_route_norm", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_IN_CC(0, 1),
     .help = "deepseek_v3: 1 divides the chosen experts' scores by their sum; -1: the "
             "flavor's."},
    {.name = "moe_route_scale", .type = CONFIG_FLOAT, .def = "-1", CONFIG_UNSET_OR_GT(0),
     .help = "deepseek_v3: factor on the route weights; -1: the flavor's."},
    {.name = "moe_load_balance_coeff", .type = CONFIG_FLOAT, .def = "-1",
     CONFIG_UNSET_OR_GE(0),
     .help = "deepseek_v3: step of the aux-loss-free balancing bias per optimizer step (0: "
             "off); -1: the flavor's (1e-3)."},
    {.name = "moe_aux_loss_alpha", .type = CONFIG_FLOAT, .def = "-1", CONFIG_UNSET_OR_GE(0),
     .help = "deepseek_v3: weight of the sequence-wise auxiliary balance loss (0: off); -1: "
             "the flavor's (0)."},
};

static int moe_from_config(const struct ct_config *cfg, struct model_config *mc)
{
	if (!moe_is_flavor(cfg->model.flavor)) {
		LOG_ERROR("model.flavor: '%s' is not a deepseek_v3 flavor (%s)", cfg->model.flavor,
		          moe_flavor_list());
		return CT_ERR_USAGE;
	}
	struct moe_config *c = moe_cfg_init(mc);
	int rc = moe_config_preset(c, cfg->model.flavor);
	if (rc)
		return rc;
	const struct int_override {
		const char *key;
		int64_t *field;
	} ints[] = {
	    {"model.moe_n_routed_experts", &c->n_routed_experts},
	    {"model.moe_n_shared_experts", &c->n_shared_experts},
	    {"model.moe_top_k", &c->top_k},
	    {"model.moe_n_dense_layers", &c->n_dense_layers},
	};
	if (cfg->model.vocab_size > 0)
		c->vocab_size = cfg->model.vocab_size;
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		int64_t v = config_get_int(cfg, ints[i].key);
		if (v >= 0)
			*ints[i].field = v;
	}
	const char *score = config_get_string(cfg, "model.moe_score_func");
	if (strcmp(score, "softmax") == 0)
		c->score_func = MOE_SCORE_SOFTMAX;
	else if (strcmp(score, "sigmoid") == 0)
		c->score_func = MOE_SCORE_SIGMOID;
	int64_t norm = config_get_int(cfg, "model.moe_route_norm");
	if (norm >= 0)
		c->route_norm = norm == 1;
	const struct float_override {
		const char *key;
		double *field;
	} floats[] = {
	    {"model.moe_route_scale", &c->route_scale},
	    {"model.moe_load_balance_coeff", &c->load_balance_coeff},
	    {"model.moe_aux_loss_alpha", &c->aux_loss_alpha},
	};
	for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++) {
		double v = config_get_float(cfg, floats[i].key);
		if (v >= 0)
			*floats[i].field = v;
	}
	return moe_config_finish(c);
}

static int moe_check_config(const struct ct_config *cfg)
{
	if (cfg->model.rope_scaling)
		return config_error("model.rope_scaling: not yet supported for deepseek_v3 (only "
		                    "read for llama3)");
	return 0;
}

const struct model_family moe_family = {
    .name = "deepseek_v3",
    .ep = true,
    .pp = true,
    .cost_model = true,
    .float8 = true,
    .cost = &moe_cost_ops,
    .export_hf = true,
    .hf = &moe_hf_ops,
    .ac = true,
    .no_tp_why = "not yet supported: the experts and attention heads are not split over "
                 "TP ranks yet",
    .no_cp_why = "not yet supported: the family's attention has no context-parallel glue "
                 "(Llama's is in src/model/llama/llama_cp.c)",
    .flavor_name = moe_flavor_name,
    .keys = moe_keys,
    .n_keys = sizeof(moe_keys) / sizeof(moe_keys[0]),
    .from_config = moe_from_config,
    .check_config = moe_check_config,
    .vocab = moe_family_vocab,
    .n_layers = moe_family_layers,
    .dim = moe_family_dim,
    .flavor = moe_family_flavor,
    .table_build = moe_family_table,
    .table_build_ep = moe_family_table_ep,
    .init_params = moe_family_init,
    .build = moe_family_build,
    .describe = moe_describe,
    .manifest_fields = moe_manifest_fields,
};
