/* The Hyena family behind the model interface (model/model.h): its operations, its entry of
 * the family table, and what it supports (one rank and FSDP; every activation saved). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/family.h"
#include "model/hyena/hyena.h"
#include "model/model_group.h"

static void hyena_op_bind(void *impl, int u, float *params, float *grads)
{
	hyena_bind_unit(impl, u, params, grads);
}
static double hyena_op_forward(void *impl, int u, int64_t *n_valid)
{
	return hyena_unit_forward(impl, u, n_valid);
}
static void hyena_op_backward(void *impl, int u, double dscale)
{
	hyena_unit_backward(impl, u, dscale);
}
static void hyena_op_recompute(void *impl, int u)
{
	(void)impl, (void)u; /* Hyena saves every activation: nothing to re-derive */
}
static bool hyena_op_needs_recompute(const void *impl, int u)
{
	(void)impl, (void)u;
	return false;
}
static void hyena_op_dscale(void *impl, double dscale)
{
	((struct hyena_model *)impl)->loss_dscale = dscale;
}
static void hyena_op_logits(void *impl, float *logits)
{
	hyena_logits(impl, logits);
}
static double hyena_op_flops(const struct model_config *c, const struct param_table *t,
                             int64_t seq_len)
{
	(void)t;
	return hyena_flops_per_token(&c->hyena, seq_len);
}
static void hyena_op_free(void *impl)
{
	hyena_free(impl);
}

static const struct model_ops hyena_ops = {
    .bind_unit = hyena_op_bind,
    .unit_forward = hyena_op_forward,
    .unit_backward = hyena_op_backward,
    .unit_recompute = hyena_op_recompute,
    .unit_needs_recompute = hyena_op_needs_recompute,
    .set_loss_dscale = hyena_op_dscale,
    .logits = hyena_op_logits,
    .flops_per_token = hyena_op_flops,
    .free = hyena_op_free,
};

void model_wrap_hyena(struct model *m, struct hyena_model *hm)
{
	CHECK(!hm->f64, "model: the trainer runs float models");
	memset(m, 0, sizeof(*m));
	m->cfg.kind = MODEL_HYENA;
	m->cfg.hyena = hm->cfg;
	m->ops = &hyena_ops;
	m->impl = hm;
	m->table = &hm->table;
	m->n_units = hm->table.n_units;
	m->B = hm->B;
	m->T = hm->T;
	m->N = hm->N;
	m->vocab_size = hm->cfg.vocab_size;
	m->tokens = hm->tokens;
	m->targets = hm->targets;
	m->params = hm->params;
	m->grads = hm->grads;
	m->unit_w = hm->unit_w;
	m->unit_dw = hm->unit_dw;
	m->act_bytes = hm->act_bytes;
	m->scratch_bytes = hm->scratch_bytes;
}

static int hyena_family_build(struct model *m, const struct model_config *c, int64_t B, int64_t T,
                              const struct model_build_opts *opts)
{
	if (opts->tp && opts->tp->size > 1) {
		LOG_ERROR("parallelism.tensor_parallel_degree = %d: not yet supported for "
		          "model.name = \"hyena\" (llama3 only)",
		          opts->tp->size);
		return CT_ERR_USAGE;
	}
	if (opts->ac != MODEL_AC_NONE || opts->recompute_ffn) {
		LOG_ERROR("activation_checkpoint.mode: Hyena models save every activation; "
		          "only \"none\" is supported");
		return CT_ERR_USAGE;
	}
	struct hyena_model *hm = xcalloc(1, sizeof(*hm));
	const struct hyena_build_opts ho = {.own_params = opts->own_params};
	int rc = hyena_build(hm, &c->hyena, B, T, &ho);
	if (rc) {
		free(hm);
		return rc;
	}
	model_wrap_hyena(m, hm);
	return CT_OK;
}

static void hyena_describe(const struct model *m, char *buf, size_t n)
{
	const struct hyena_config *c = &m->cfg.hyena;
	snprintf(buf, n,
	         "hyena %s: %lld parameters (dim %lld, %lld layers, order %lld, filter "
	         "order %lld, emb_dim %lld, ffn %lld, l_max %lld, vocab %lld)",
	         c->flavor, (long long)m->table->numel, (long long)c->dim,
	         (long long)c->n_layers, (long long)c->order, (long long)c->filter_order,
	         (long long)c->emb_dim, (long long)c->ffn_hidden, (long long)c->l_max,
	         (long long)c->vocab_size);
}

static int64_t hyena_family_vocab(const struct model_config *c)
{
	return c->hyena.vocab_size;
}
static int64_t hyena_family_layers(const struct model_config *c)
{
	return c->hyena.n_layers;
}
static int64_t hyena_family_dim(const struct model_config *c)
{
	return c->hyena.dim;
}
static const char *hyena_family_flavor(const struct model_config *c)
{
	return c->hyena.flavor;
}
static int hyena_family_table(struct param_table *t, const struct model_config *c)
{
	return hyena_table_build(t, &c->hyena);
}
static void hyena_family_init(const struct model_config *c, const struct param_table *t,
                              uint64_t seed, float *out, int64_t first, int64_t n)
{
	hyena_init_params(&c->hyena, t, seed, out, first, n);
}

static void hyena_manifest_fields(const struct model_config *mc, cJSON *o)
{
	const struct hyena_config *c = &mc->hyena;
	cJSON_AddStringToObject(o, "flavor", c->flavor);
	cJSON_AddNumberToObject(o, "dim", (double)c->dim);
	cJSON_AddNumberToObject(o, "n_layers", (double)c->n_layers);
	cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
	cJSON_AddNumberToObject(o, "order", (double)c->order);
	cJSON_AddNumberToObject(o, "filter_order", (double)c->filter_order);
	cJSON_AddNumberToObject(o, "emb_dim", (double)c->emb_dim);
	cJSON_AddNumberToObject(o, "ffn_hidden", (double)c->ffn_hidden);
	cJSON_AddNumberToObject(o, "l_max", (double)c->l_max);
	cJSON_AddNumberToObject(o, "sin_freq", c->sin_freq);
	cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps);
}

const struct model_family hyena_family = {
    .name = "hyena",
    .kind = MODEL_HYENA,
    .vocab = hyena_family_vocab,
    .n_layers = hyena_family_layers,
    .dim = hyena_family_dim,
    .flavor = hyena_family_flavor,
    .table_build = hyena_family_table,
    .init_params = hyena_family_init,
    .build = hyena_family_build,
    .describe = hyena_describe,
    .manifest_fields = hyena_manifest_fields,
};
