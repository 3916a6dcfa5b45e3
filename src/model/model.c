/* The model-family interface: Llama and Hyena behind one table of operations. */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/model_group.h"
#include "kernels/fp8_linear.h"

static const char *const model_kind_names[] = {"llama3", "hyena"};
_Static_assert(sizeof(model_kind_names) / sizeof(model_kind_names[0]) == MODEL_KIND_COUNT,
               "one name per model kind");

const char *model_kind_name(enum model_kind k)
{
	return k >= 0 && k < MODEL_KIND_COUNT ? model_kind_names[k] : "?";
}

int64_t model_config_vocab(const struct model_config *c)
{
	return c->kind == MODEL_HYENA ? c->hyena.vocab_size : c->llama.vocab_size;
}

const char *model_config_flavor(const struct model_config *c)
{
	return c->kind == MODEL_HYENA ? c->hyena.flavor : c->llama.flavor;
}

int model_table_build(struct param_table *t, const struct model_config *c)
{
	return c->kind == MODEL_HYENA ? hyena_table_build(t, &c->hyena)
	                              : llama_table_build(t, &c->llama);
}

void model_init_params_cfg(const struct model_config *c, const struct param_table *t, uint64_t seed,
                           float *out, int64_t first, int64_t n)
{
	if (c->kind == MODEL_HYENA)
		hyena_init_params(&c->hyena, t, seed, out, first, n);
	else
		llama_init_params(&c->llama, t, seed, out, first, n);
}

bool model_fp8_linear(const struct param_entry *e)
{
	return e->ndim == 2 && strncmp(e->name, "tok_embeddings", 14) != 0 &&
	       fp8_linear_wants(e->name);
}

/* Keeps the float8 registry (kernels/fp8_linear.h) in step with where unit u's parameters
 * are bound: its float8 linears' weights, found by the table, are registered at their new
 * addresses (a rebind to the same buffer, e.g. to attach gradients, keeps them as they are). */
static void model_fp8_bind(const struct param_table *t, int u, const float *params)
{
	if (!fp8_linear_enabled() || fp8_linear_unit_is(u, params))
		return;
	fp8_linear_unit_clear(u);
	if (!params)
		return;
	fp8_linear_unit_set(u, params);
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *e = &t->p[i];
		if (e->unit == u && model_fp8_linear(e))
			fp8_linear_add(u, params + (e->offset - t->unit_begin[u]), e->shape[0],
			               e->shape[1]);
	}
}

/* ---------------------------------------------------------------- Llama */

static void llama_op_bind(void *impl, int u, float *params, float *grads)
{
	llama_bind_unit(impl, u, params, grads);
	model_fp8_bind(&((struct llama_model *)impl)->table, u, params);
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
static double unit_pass(const struct model_ops *ops, void *impl, int u, enum model_pass p, int op,
                        double dscale, bool *ran);
static const struct model_ops llama_ops;
static double llama_op_unit_op(void *impl, int u, enum model_pass p, int op, double dscale,
                               bool *ran)
{
	if (!((struct llama_model *)impl)->tp) /* one segment per pass */
		return unit_pass(&llama_ops, impl, u, p, op, dscale, ran);
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
static double llama_op_flops(const struct model_config *c, const struct param_table *t,
                             int64_t seq_len)
{
	return llama_flops_per_token(&c->llama, t, seq_len);
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
    .flops_per_token = llama_op_flops,
    .free = llama_op_free,
};

/* ---------------------------------------------------------------- Hyena */

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

/* ---------------------------------------------------------------- build */

void model_wrap_llama(struct model *m, struct llama_model *lm)
{
	memset(m, 0, sizeof(*m));
	m->cfg.kind = MODEL_LLAMA;
	m->cfg.llama = lm->cfg;
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
}

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

int model_build(struct model *m, const struct model_config *c, int64_t B, int64_t T,
                const struct model_build_opts *opts)
{
	memset(m, 0, sizeof(*m));
	int rc;
	if (c->kind == MODEL_HYENA) {
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
		rc = hyena_build(hm, &c->hyena, B, T, &ho);
		if (rc) {
			free(hm);
			return rc;
		}
		model_wrap_hyena(m, hm);
	} else {
		struct llama_model *lm = xcalloc(1, sizeof(*lm));
		const struct llama_build_opts lo = {.own_params = opts->own_params,
		                                    .recompute_ffn = opts->recompute_ffn,
		                                    .ac = opts->ac,
		                                    .tp = opts->tp,
		                                    .unit_lo = opts->unit_lo,
		                                    .unit_hi = opts->unit_hi,
		                                    .split_backward = opts->split_backward,
		                                    .tp_async = opts->tp_async};
		rc = llama_build_ex(lm, &c->llama, B, T, &lo);
		if (rc) {
			free(lm);
			return rc;
		}
		model_wrap_llama(m, lm);
	}
	m->owns_impl = true;
	return CT_OK;
}

void model_free(struct model *m)
{
	if (m->impl && m->owns_impl) {
		m->ops->free(m->impl);
		free(m->impl);
	}
	memset(m, 0, sizeof(*m));
}

double model_forward(struct model *m, int64_t *n_valid)
{
	double loss = 0.0;
	for (int u = 0; u < m->n_units; u++)
		loss += model_unit_forward(m, u, n_valid);
	return loss;
}

void model_backward(struct model *m, double dscale)
{
	for (int u = m->n_units - 1; u >= 0; u--) {
		if (model_unit_needs_recompute(m, u)) /* as the schedule's RECOMPUTE node */
			model_unit_recompute(m, u);
		model_unit_backward(m, u, dscale);
	}
}

void model_init_params(const struct model *m, uint64_t seed, float *out, int64_t first, int64_t n)
{
	model_init_params_cfg(&m->cfg, m->table, seed, out, first, n);
}

double model_flops_per_token(const struct model *m, int64_t seq_len)
{
	return m->ops->flops_per_token(&m->cfg, m->table, seq_len);
}

void model_describe(const struct model *m, char *buf, size_t n)
{
	if (m->cfg.kind == MODEL_HYENA) {
		const struct hyena_config *c = &m->cfg.hyena;
		snprintf(buf, n,
		         "hyena %s: %lld parameters (dim %lld, %lld layers, order %lld, filter "
		         "order %lld, emb_dim %lld, ffn %lld, l_max %lld, vocab %lld)",
		         c->flavor, (long long)m->table->numel, (long long)c->dim,
		         (long long)c->n_layers, (long long)c->order, (long long)c->filter_order,
		         (long long)c->emb_dim, (long long)c->ffn_hidden, (long long)c->l_max,
		         (long long)c->vocab_size);
	} else {
		const struct llama_config *c = &m->cfg.llama;
		snprintf(buf, n,
		         "llama3 %s: %lld parameters (dim %lld, %lld layers, %lld heads, %lld kv "
		         "heads, ffn %lld, vocab %lld)",
		         c->flavor, (long long)m->table->numel, (long long)c->dim,
		         (long long)c->n_layers, (long long)c->n_heads, (long long)c->n_kv_heads,
		         (long long)c->ffn_hidden, (long long)c->vocab_size);
	}
}

void model_unit_prog(const struct model *m, int u, enum model_pass p, struct model_prog *out)
{
	if (m->ops->unit_prog) {
		m->ops->unit_prog(m->impl, u, p, out);
		return;
	}
	memset(out, 0, sizeof(*out));
}

/* A one-segment program: op 0 is the whole pass. */
static double unit_pass(const struct model_ops *ops, void *impl, int u, enum model_pass p, int op,
                        double dscale, bool *ran)
{
	CHECK(op == 0, "unit %d: op %d of a one-segment program", u, op);
	if (ran)
		*ran = false;
	if (p == MODEL_PASS_FWD)
		return ops->unit_forward(impl, u, NULL);
	if (p == MODEL_PASS_BWD)
		ops->unit_backward(impl, u, dscale);
	else
		ops->unit_recompute(impl, u);
	return 0.0;
}

double model_unit_op(struct model *m, int u, enum model_pass p, int op, double dscale, bool *ran)
{
	if (m->ops->unit_op)
		return m->ops->unit_op(m->impl, u, p, op, dscale, ran);
	return unit_pass(m->ops, m->impl, u, p, op, dscale, ran);
}
