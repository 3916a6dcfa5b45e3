/* The Llama 3 family behind the model interface (model/model.h): its operations, its entry
 * of the family table, and what it supports. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/config.h"
#include "model/family.h"
#include "model/llama/llama.h"
#include "model/llama/llama_cost.h"
#include "model/llama/llama_hf.h"
#include "model/model_group.h"

/* This family's entry of the table (below; model/model.c lists it). */
extern const struct model_family llama_family;

/* ---------------------------------------------------------------- its config */

_Static_assert(MODEL_IGNORE_INDEX == LLAMA_IGNORE_INDEX, "one ignore index");

_Static_assert(sizeof(struct llama_config) <= MODEL_CONFIG_BYTES &&
                   _Alignof(struct llama_config) <= _Alignof(max_align_t),
               "a llama_config fits a model_config");

struct llama_config *llama_cfg_mut(struct model_config *mc)
{
	CHECK(mc->kind == model_family_kind(&llama_family), "model: a %s config read as %s",
	      model_kind_name(mc->kind), llama_family.name);
	return (struct llama_config *)(void *)mc->family;
}

const struct llama_config *llama_cfg(const struct model_config *mc)
{
	return llama_cfg_mut((struct model_config *)mc);
}

struct llama_config *llama_cfg_init(struct model_config *mc)
{
	memset(mc, 0, sizeof(*mc));
	mc->kind = model_family_kind(&llama_family);
	return (struct llama_config *)(void *)mc->family;
}

static void llama_op_bind(void *impl, int u, float *params, float *grads)
{
	llama_bind_unit(impl, u, params, grads);
	struct llama_model *m = impl;
	model_fp8_bind(&m->table, u, params, m->tp, m->cp);
}
static double llama_op_forward(void *impl, int u, int64_t *n_valid)
{
	return llama_unit_forward(impl, u, n_valid);
}
static void llama_op_backward(void *impl, int u, double dscale)
{
	llama_unit_backward(impl, u, dscale);
}
static void llama_op_backward_weight(void *impl, int u)
{
	llama_unit_backward_weight(impl, u);
}
static void llama_op_recompute(void *impl, int u)
{
	llama_unit_recompute(impl, u);
}
static bool llama_op_needs_recompute(const void *impl, int u)
{
	return llama_unit_needs_recompute(impl, u);
}
static void llama_op_prog(const void *impl, int u, enum model_pass p, struct model_prog *out)
{
	llama_unit_prog(impl, u, p, out);
}
static const struct model_ops llama_ops;
static double llama_op_unit_op(void *impl, int u, enum model_pass p, int op, double dscale,
                               bool *ran)
{
	const struct llama_model *lm = impl;
	if (!lm->tp && !lm->cp) /* one segment per pass */
		return model_unit_pass(&llama_ops, impl, u, p, op, dscale, ran);
	return llama_unit_op(impl, u, p, op, dscale, NULL, ran);
}
static void llama_op_dscale(void *impl, double dscale)
{
	((struct llama_model *)impl)->loss_dscale = dscale;
}
static void llama_op_logits(void *impl, float *logits)
{
	llama_logits(impl, logits);
}
static float *llama_op_unit_output(void *impl, int u)
{
	struct llama_model *lm = impl;
	return u < lm->cfg.n_layers ? lm->acts[u].x : lm->x_final;
}
static float *llama_op_residual_grad(void *impl)
{
	return ((struct llama_model *)impl)->dres;
}
static double llama_op_flops(const struct model_config *c, const struct param_table *t,
                             int64_t seq_len)
{
	return llama_flops_per_token(llama_cfg(c), t, seq_len);
}
static void llama_op_free(void *impl)
{
	llama_free(impl);
}

static const struct model_ops llama_ops = {
    .bind_unit = llama_op_bind,
    .unit_forward = llama_op_forward,
    .unit_backward = llama_op_backward,
    .unit_backward_weight = llama_op_backward_weight,
    .unit_recompute = llama_op_recompute,
    .unit_needs_recompute = llama_op_needs_recompute,
    .unit_prog = llama_op_prog,
    .unit_op = llama_op_unit_op,
    .set_loss_dscale = llama_op_dscale,
    .logits = llama_op_logits,
    .unit_output = llama_op_unit_output,
    .residual_grad = llama_op_residual_grad,
    .flops_per_token = llama_op_flops,
    .free = llama_op_free,
};

void model_wrap_llama(struct model *m, struct llama_model *lm)
{
	memset(m, 0, sizeof(*m));
	*llama_cfg_init(&m->cfg) = lm->cfg;
	m->ops = &llama_ops;
	m->impl = lm;
	m->table = &lm->table;
	m->n_units = lm->table.n_units;
	m->B = lm->B;
	m->T = lm->T;
	m->N = lm->N;
	m->vocab_size = lm->cfg.vocab_size;
	m->tokens = lm->tokens;
	m->targets = lm->targets;
	m->params = lm->params;
	m->grads = lm->grads;
	m->unit_w = lm->unit_w;
	m->unit_dw = lm->unit_dw;
	m->act_bytes = lm->act_bytes;
	m->scratch_bytes = lm->scratch_bytes;
	m->ac = lm->ac;
	m->ac_every = lm->ac_every;
}

static int llama_family_build(struct model *m, const struct model_config *c, int64_t B, int64_t T,
                              const struct model_build_opts *opts)
{
	struct llama_model *lm = xcalloc(1, sizeof(*lm));
	const struct llama_build_opts lo = {.own_params = opts->own_params,
	                                    .recompute_ffn = opts->recompute_ffn,
	                                    .ac = opts->ac,
	                                    .ac_every = opts->ac_every,
	                                    .tp = opts->tp,
	                                    .unit_lo = opts->unit_lo,
	                                    .unit_hi = opts->unit_hi,
	                                    .split_backward = opts->split_backward,
	                                    .tp_async = opts->tp_async,
	                                    .cp = opts->cp,
	                                    .cp_order = opts->cp_order,
	                                    .cp_ring = opts->cp_ring};
	int rc = llama_build_ex(lm, llama_cfg(c), B, T, &lo);
	if (rc) {
		free(lm);
		return rc;
	}
	model_wrap_llama(m, lm);
	return CT_OK;
}

static void llama_describe(const struct model *m, char *buf, size_t n)
{
	const struct llama_config *c = llama_cfg(&m->cfg);
	snprintf(buf, n,
	         "llama3 %s: %lld parameters (dim %lld, %lld layers, %lld heads, %lld kv "
	         "heads, ffn %lld, vocab %lld)",
	         c->flavor, (long long)m->table->numel, (long long)c->dim,
	         (long long)c->n_layers, (long long)c->n_heads, (long long)c->n_kv_heads,
	         (long long)c->ffn_hidden, (long long)c->vocab_size);
}

static int64_t llama_family_vocab(const struct model_config *c)
{
	return llama_cfg(c)->vocab_size;
}
static int64_t llama_family_layers(const struct model_config *c)
{
	return llama_cfg(c)->n_layers;
}
static int64_t llama_family_dim(const struct model_config *c)
{
	return llama_cfg(c)->dim;
}
static int llama_family_table_tp(struct param_table *t, const struct model_config *c, int tp,
                                 int tp_rank)
{
	return llama_table_build_tp(t, llama_cfg(c), tp, tp_rank);
}
static int llama_family_tp_check(const struct model_config *mc, int64_t tp)
{
	const struct llama_config *c = llama_cfg(mc);
	/* Heads are split, never replicated: tp > n_kv_heads (KV-head replication) is refused. */
	if (c->n_heads % tp || c->n_kv_heads % tp) {
		LOG_ERROR("parallelism.tensor_parallel_degree = %lld must divide the model's "
		          "n_heads (%lld) and n_kv_heads (%lld) (model.flavor = %s; KV heads are "
		          "not replicated, so tp may not exceed n_kv_heads)",
		          (long long)tp, (long long)c->n_heads, (long long)c->n_kv_heads, c->flavor);
		return CT_ERR_USAGE;
	}
	if (c->ffn_hidden % tp) {
		LOG_ERROR("parallelism.tensor_parallel_degree = %lld must divide the FFN hidden "
		          "size %lld (model.flavor = %s)",
		          (long long)tp, (long long)c->ffn_hidden, c->flavor);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}
static const char *llama_family_flavor(const struct model_config *c)
{
	return llama_cfg(c)->flavor;
}
static int llama_family_table(struct param_table *t, const struct model_config *c)
{
	return llama_table_build(t, llama_cfg(c));
}
static void llama_family_init(const struct model_config *c, const struct param_table *t,
                              uint64_t seed, float *out, int64_t first, int64_t n)
{
	llama_init_params(llama_cfg(c), t, seed, out, first, n);
}

static void llama_manifest_fields(const struct model_config *mc, cJSON *o)
{
	const struct llama_config *c = llama_cfg(mc);
	cJSON_AddStringToObject(o, "flavor", c->flavor);
	cJSON_AddNumberToObject(o, "dim", (double)c->dim);
	cJSON_AddNumberToObject(o, "n_layers", (double)c->n_layers);
	cJSON_AddNumberToObject(o, "n_heads", (double)c->n_heads);
	cJSON_AddNumberToObject(o, "n_kv_heads", (double)c->n_kv_heads);
	cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
	cJSON_AddNumberToObject(o, "ffn_hidden", (double)c->ffn_hidden);
	cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps);
	cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
	cJSON_AddBoolToObject(o, "rope_scaling", c->rope_scaling);
}

/* The flavor's shape, then model.vocab_size and model.rope_scaling. */
static int llama_from_config(const struct ct_config *cfg, struct model_config *mc)
{
	const struct model_family *other = model_family_of_flavor(cfg->model.flavor);
	if (other && other != &llama_family) {
		LOG_ERROR("model.flavor: '%s' is a %s flavor; set model.name = \"%s\"",
		          cfg->model.flavor, other->name, other->name);
		return CT_ERR_USAGE;
	}
	struct llama_config *c = llama_cfg_init(mc);
	int rc = llama_config_preset(c, cfg->model.flavor);
	if (rc)
		return rc;
	if (cfg->model.vocab_size > 0)
		c->vocab_size = cfg->model.vocab_size;
	c->rope_scaling = cfg->model.rope_scaling;
	return llama_config_finish(c);
}

const struct model_family llama_family = {
    .name = "llama3",
    .flavor_name = llama_flavor_name,
    .from_config = llama_from_config,
    .tp = true,
    .pp = true,
    .ac = true,
    .float8 = true,
    .export_hf = true,
    .cost_model = true,
    .cp = true,
    .vocab = llama_family_vocab,
    .n_layers = llama_family_layers,
    .dim = llama_family_dim,
    .flavor = llama_family_flavor,
    .table_build = llama_family_table,
    .table_build_tp = llama_family_table_tp,
    .tp_check = llama_family_tp_check,
    .init_params = llama_family_init,
    .build = llama_family_build,
    .describe = llama_describe,
    .manifest_fields = llama_manifest_fields,
    .cost = &llama_cost_ops,
    .hf = &llama_hf_ops,
};
