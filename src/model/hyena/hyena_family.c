/* The Hyena family behind the model interface (model/model.h): its operations, its entry of
 * the family table, and what it supports (one rank, FSDP, TP (not sequence-parallel) and PP;
 * every activation checkpointing mode; float8 linears; the cost model, hyena_cost.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/config.h"
#include "model/family.h"
#include "model/hyena/hyena.h"
#include "model/hyena/hyena_cost.h"
#include "kernels/fp8_linear.h"
#include "model/model_group.h"

/* This family's entry of the table (below; model/model.c lists it) and its export format
 * (hyena_hf.c). */
extern const struct model_family hyena_family;
extern const struct model_hf_ops hyena_hf_ops;

/* ---------------------------------------------------------------- its config */

_Static_assert(sizeof(struct hyena_config) <= MODEL_CONFIG_BYTES &&
                   _Alignof(struct hyena_config) <= _Alignof(max_align_t),
               "a hyena_config fits a model_config");

struct hyena_config *hyena_cfg_mut(struct model_config *mc)
{
	CHECK(mc->kind == model_family_kind(&hyena_family), "model: a %s config read as %s",
	      model_kind_name(mc->kind), hyena_family.name);
	return (struct hyena_config *)(void *)mc->family;
}

const struct hyena_config *hyena_cfg(const struct model_config *mc)
{
	return hyena_cfg_mut((struct model_config *)mc);
}

struct hyena_config *hyena_cfg_init(struct model_config *mc)
{
	memset(mc, 0, sizeof(*mc));
	mc->kind = model_family_kind(&hyena_family);
	return (struct hyena_config *)(void *)mc->family;
}

/* binds unit u, and keeps the float8 registry in step: out_proj, fc1 and fc2 are the
 * table's float8 linears; in_proj is the group of its N+1 stream tensors, one (P, D) linear
 * (P rows of this rank's channels under tensor parallelism), registered here */
static void hyena_op_bind(void *impl, int u, float *params, float *grads)
{
	struct hyena_model *hm = impl;
	const struct hyena_config *c = &hm->cfg;
	bool fresh = fp8_linear_enabled() && params && !fp8_linear_unit_is(u, params);
	hyena_bind_unit(hm, u, params, grads);
	model_fp8_bind(&hm->table, u, params, hm->tp, NULL);
	if (!fresh || u < 1 || u > c->n_layers)
		return;
	const struct param_entry *e =
	    &hm->table.p[hyena_block_tensor_index(c, u - 1, HYB_IN_W)];
	if (!fp8_linear_wants(e->name))
		return;
	bool split = hm->tp != NULL;
	struct fp8_slice sl = {.dim = split ? 0 : -1,
	                       .max_f32 = split ? hm->tp->all_reduce_max_f32 : NULL,
	                       .ctx = split ? hm->tp->ctx : NULL};
	fp8_linear_add(u, params + (e->offset - hm->table.unit_begin[u]),
	               (c->order + 1) * e->shape[0], e->shape[1], &sl);
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
	hyena_unit_recompute(impl, u);
}
static bool hyena_op_needs_recompute(const void *impl, int u)
{
	return hyena_unit_needs_recompute(impl, u);
}
/* the residual stream between units: unit u's output is block u's input (x_final after the
 * last block); the gradient buffer the units' backwards pass down */
static float *hyena_op_unit_output(void *impl, int u)
{
	struct hyena_model *hm = impl;
	CHECK(u >= 0 && u <= hm->cfg.n_layers && u >= hm->unit_lo - 1 && u <= hm->unit_hi - 1,
	      "hyena: unit %d has no residual output in units [%d, %d)", u, hm->unit_lo,
	      hm->unit_hi);
	return (float *)hm->acts + (u < hm->cfg.n_layers ? hm->blk[u].x : hm->x_final);
}
static float *hyena_op_residual_grad(void *impl)
{
	struct hyena_model *hm = impl;
	return (float *)hm->scratch + hm->s_dres;
}
/* the tied embedding (tensor 0 of the table), as the head reads it */
static void hyena_op_set_tied(void *impl, const float *w)
{
	((struct hyena_model *)impl)->tied_src = w;
}
static float *hyena_op_tied_grad(void *impl)
{
	struct hyena_model *hm = impl;
	return (float *)hm->acts + hm->tied_dw;
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
	/* with a tensor-parallel table: this rank's share of the model's FLOPs (the trainer's
	 * MFU multiplies it by tp again; the replicated head's repeated work is no model FLOP) */
	int64_t tp = t && t->tp_size > 1 ? t->tp_size : 1;
	return hyena_flops_per_token(hyena_cfg(c), seq_len) / (double)tp;
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
    .unit_output = hyena_op_unit_output,
    .residual_grad = hyena_op_residual_grad,
    .set_tied = hyena_op_set_tied,
    .tied_grad = hyena_op_tied_grad,
    .logits = hyena_op_logits,
    .flops_per_token = hyena_op_flops,
    .free = hyena_op_free,
};

void model_wrap_hyena(struct model *m, struct hyena_model *hm)
{
	CHECK(!hm->f64, "model: the trainer runs float models");
	memset(m, 0, sizeof(*m));
	*hyena_cfg_init(&m->cfg) = hm->cfg;
	m->ops = &hyena_ops;
	m->impl = hm;
	m->table = &hm->table;
	m->ac = hm->ac;
	m->ac_every = hm->ac_every;
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
	if (opts->tp && opts->tp->size > 1 && opts->tp_async) {
		LOG_ERROR("parallelism.enable_async_tensor_parallel: not supported for model.name = "
		          "\"hyena\" (its tensor parallelism is not sequence-parallel: the "
		          "all-reduces of the row-parallel out_proj and fc2 have no all-gather or "
		          "reduce-scatter to decompose into ring steps)");
		return CT_ERR_USAGE;
	}
	struct hyena_model *hm = xcalloc(1, sizeof(*hm));
	const struct hyena_build_opts ho = {
	    .own_params = opts->own_params,
	    .ac = opts->recompute_ffn ? MODEL_AC_FFN : opts->ac,
	    .ac_every = opts->ac_every,
	    .unit_lo = opts->unit_lo,
	    .unit_hi = opts->unit_hi,
	    .tp = opts->tp};
	int rc = hyena_build(hm, hyena_cfg(c), B, T, &ho);
	if (rc) {
		free(hm);
		return rc;
	}
	model_wrap_hyena(m, hm);
	return CT_OK;
}

static void hyena_describe(const struct model *m, char *buf, size_t n)
{
	const struct hyena_config *c = hyena_cfg(&m->cfg);
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
	return hyena_cfg(c)->vocab_size;
}
static int64_t hyena_family_layers(const struct model_config *c)
{
	return hyena_cfg(c)->n_layers;
}
static int64_t hyena_family_dim(const struct model_config *c)
{
	return hyena_cfg(c)->dim;
}
static const char *hyena_family_flavor(const struct model_config *c)
{
	return hyena_cfg(c)->flavor;
}
static int hyena_family_table(struct param_table *t, const struct model_config *c)
{
	return hyena_table_build(t, hyena_cfg(c));
}
static int hyena_family_table_tp(struct param_table *t, const struct model_config *c, int tp,
                                 int tp_rank)
{
	return hyena_table_build_tp(t, hyena_cfg(c), tp, tp_rank);
}
static int hyena_family_tp_check(const struct model_config *c, int64_t tp)
{
	return hyena_tp_check(hyena_cfg(c), tp);
}
static int hyena_family_tensor_group(const struct model_config *c, const char *name, char *group,
                                     size_t n, int *piece)
{
	return hyena_name_group(hyena_cfg(c), name, group, n, piece);
}
static void hyena_family_init(const struct model_config *c, const struct param_table *t,
                              uint64_t seed, float *out, int64_t first, int64_t n)
{
	hyena_init_params(hyena_cfg(c), t, seed, out, first, n);
}

static void hyena_manifest_fields(const struct model_config *mc, cJSON *o)
{
	const struct hyena_config *c = hyena_cfg(mc);
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

/* ---------------------------------------------------------------- run configuration */

/* Hyena's own `[model]` keys (-1: the flavor's value). */
static const struct config_key_def hyena_keys[] = {
    {.name = "hyena_order", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(2),
     .help = "Hyena order N: N-1 gated long convolutions per block; -1: the flavor's (2)."},
    {.name = "hyena_filter_order", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(1),
     .help = "Width of Hyena's implicit filter MLP; -1: the flavor's."},
    {.name = "hyena_emb_dim", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(3),
     .help = "Positional features of Hyena's implicit filter (odd); -1: the flavor's."},
    {.name = "hyena_sin_freq", .type = CONFIG_FLOAT, .def = "-1", CONFIG_UNSET_OR_GT(0),
     .help = "Initial frequency of the filter's sine activations (> 0); -1: the flavor's."},
    {.name = "hyena_l_max", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(1),
     .help = "Length of Hyena's long filters (>= training.seq_len); -1: training.seq_len."},
};

/* The flavor's shape, then model.vocab_size and the model.hyena_* overrides; l_max =
 * model.hyena_l_max or training.seq_len. */
static int hyena_from_config(const struct ct_config *cfg, struct model_config *mc)
{
	if (!hyena_is_flavor(cfg->model.flavor)) {
		LOG_ERROR("model.flavor: '%s' is not a hyena flavor (%s)", cfg->model.flavor,
		          hyena_flavor_list());
		return CT_ERR_USAGE;
	}
	struct hyena_config *hc = hyena_cfg_init(mc);
	int rc = hyena_config_preset(hc, cfg->model.flavor);
	if (rc)
		return rc;
	const struct int_override {
		int64_t value, *field;
	} keys[] = {
	    {cfg->model.vocab_size, &hc->vocab_size},
	    {config_get_int(cfg, "model.hyena_order"), &hc->order},
	    {config_get_int(cfg, "model.hyena_filter_order"), &hc->filter_order},
	    {config_get_int(cfg, "model.hyena_emb_dim"), &hc->emb_dim},
	};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (keys[i].value > 0)
			*keys[i].field = keys[i].value;
	double sin_freq = config_get_float(cfg, "model.hyena_sin_freq");
	int64_t l_max = config_get_int(cfg, "model.hyena_l_max");
	if (sin_freq > 0)
		hc->sin_freq = sin_freq;
	hc->l_max = l_max > 0 ? l_max : cfg->training.seq_len;
	if (hc->l_max < cfg->training.seq_len) {
		LOG_ERROR("model.hyena_l_max: %lld is shorter than training.seq_len %lld",
		          (long long)hc->l_max, (long long)cfg->training.seq_len);
		return CT_ERR_USAGE;
	}
	return hyena_config_finish(hc);
}

static int hyena_check_config(const struct ct_config *cfg)
{
	if (cfg->model.rope_scaling)
		return config_error("model.rope_scaling: Hyena has no RoPE (only read for llama3)");
	return 0;
}

const struct model_family hyena_family = {
    .name = "hyena",
    .no_cp_why = "its long convolution mixes every position of the sequence with every "
                 "earlier one through an FFT over the whole sequence, so a sequence shard "
                 "cannot be computed from its own tokens and a key/value exchange; see README",
    .flavor_name = hyena_flavor_name,
    .keys = hyena_keys,
    .n_keys = sizeof(hyena_keys) / sizeof(hyena_keys[0]),
    .from_config = hyena_from_config,
    .check_config = hyena_check_config,
    .vocab = hyena_family_vocab,
    .n_layers = hyena_family_layers,
    .dim = hyena_family_dim,
    .flavor = hyena_family_flavor,
    .table_build = hyena_family_table,
    .table_build_tp = hyena_family_table_tp,
    .tp_check = hyena_family_tp_check,
    .tensor_group = hyena_family_tensor_group,
    .init_params = hyena_family_init,
    .build = hyena_family_build,
    .describe = hyena_describe,
    .manifest_fields = hyena_manifest_fields,
    .ac = true,
    .tp = true,
    .tp_whole_stream = true,
    .pp = true,
    .float8 = true,
    .tied_head = true,
    .export_hf = true,
    .cost_model = true,
    .hf = &hyena_hf_ops,
    .cost = &hyena_cost_ops,
};
