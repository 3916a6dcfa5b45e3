/* The model-family interface: the family table and what every family shares. */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/config.h"
#include "model/family.h"
#include "kernels/fp8_linear.h"
#include "model/model_group.h"

/* Each built-in family's entry (defined in its folder, src/model/<family>/). */
extern const struct model_family llama_family, hyena_family, moe_family;

/* The family table: the one place that lists the built-in families; a family's kind is its
 * index; families registered at run time follow them. */
static const struct model_family *const model_builtin[] = {&llama_family, &hyena_family,
                                                           &moe_family};
#define MODEL_N_BUILTIN ((int)(sizeof(model_builtin) / sizeof(model_builtin[0])))
static const struct model_family *model_added[MODEL_FAMILY_MAX];
static int model_n_added;

static int model_n_families(void)
{
	return MODEL_N_BUILTIN + model_n_added;
}

static const struct model_family *model_family_at(int i)
{
	return i < MODEL_N_BUILTIN ? model_builtin[i] : model_added[i - MODEL_N_BUILTIN];
}

int model_family_register(const struct model_family *f)
{
	if (model_n_families() == MODEL_FAMILY_MAX || model_family_named(f->name))
		return MODEL_KIND_NONE;
	model_added[model_n_added++] = f;
	return model_n_families() - 1;
}

const struct model_family *model_family_of(enum model_kind k)
{
	CHECK((int)k >= 0 && (int)k < model_n_families(), "model: no family for kind %d", (int)k);
	return model_family_at(k);
}

enum model_kind model_family_kind(const struct model_family *f)
{
	for (int i = 0; i < model_n_families(); i++)
		if (model_family_at(i) == f)
			return (enum model_kind)i;
	CHECK(false, "model: family %s is not in the table", f->name);
}

const struct model_family *model_family_named(const char *name)
{
	for (int i = 0; i < model_n_families(); i++)
		if (strcmp(model_family_at(i)->name, name) == 0)
			return model_family_at(i);
	return NULL;
}

const char *model_family_list(void)
{
	static char list[256];
	list[0] = 0;
	for (int i = 0; i < model_n_families(); i++)
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
		         model_family_at(i)->name);
	return list;
}

const struct model_family *model_family_of_flavor(const char *flavor)
{
	for (int i = 0; i < model_n_families(); i++) {
		const struct model_family *f = model_family_at(i);
		for (int j = 0; f->flavor_name && f->flavor_name(j); j++)
			if (strcmp(f->flavor_name(j), flavor) == 0)
				return f;
	}
	return NULL;
}

/* ---------------------------------------------------------------- run configuration */

/* config_validate's check of the families' keys: a family's key set for another family
 * would do nothing, so it is refused; then the named family's own checks. */
static int model_config_check(const struct ct_config *cfg)
{
	char key[160];
	for (int i = 0; i < model_n_families(); i++) {
		const struct model_family *f = model_family_at(i);
		if (strcmp(cfg->model.name, f->name) == 0)
			continue;
		for (int j = 0; j < f->n_keys; j++) {
			snprintf(key, sizeof(key), "model.%s", f->keys[j].name);
			if (!config_is_default(cfg, key))
				return config_error(
				    "%s: only read when model.name = \"%s\" (this is %s)", key,
				    f->name, cfg->model.name);
		}
	}
	const struct model_family *f = model_family_named(cfg->model.name);
	return f && f->check_config ? f->check_config(cfg) : 0;
}

/* "a .. z" for a long list of presets, "a, b" for a short one */
static void model_flavors_text(const struct model_family *f, char *buf, size_t n)
{
	int count = 0;
	while (f->flavor_name(count))
		count++;
	if (count > 2) {
		snprintf(buf, n, "%s .. %s", f->flavor_name(0), f->flavor_name(count - 1));
		return;
	}
	buf[0] = 0;
	for (int j = 0; j < count; j++)
		snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", j ? ", " : "",
		         f->flavor_name(j));
}

void model_config_schema_init(void)
{
	static bool done;
	static const char *flavors[64];
	static char help[512];
	char one[160];
	int n = 0;
	if (done)
		return;
	done = true;
	snprintf(help, sizeof(help), "Model size within the family (");
	for (int i = 0; i < model_n_families(); i++) {
		const struct model_family *f = model_family_at(i);
		if (f->n_keys)
			config_add_keys("model", f->keys, (size_t)f->n_keys);
		if (!f->flavor_name)
			continue;
		for (int j = 0; f->flavor_name(j); j++) {
			CHECK(n + 1 < (int)(sizeof(flavors) / sizeof(flavors[0])),
			      "too many flavors");
			flavors[n++] = f->flavor_name(j);
		}
		model_flavors_text(f, one, sizeof(one));
		snprintf(help + strlen(help), sizeof(help) - strlen(help), "%s%s: %s",
		         help[strlen(help) - 1] == '(' ? "" : "; ", f->name, one);
	}
	snprintf(help + strlen(help), sizeof(help) - strlen(help), ").");
	flavors[n] = NULL;
	config_set_choices("model.flavor", flavors, help);
	config_add_check(model_config_check);
}

const char *model_kind_name(enum model_kind k)
{
	return (int)k >= 0 && (int)k < model_n_families() ? model_family_at(k)->name : "?";
}

int64_t model_config_vocab(const struct model_config *c)
{
	return model_family_of(c->kind)->vocab(c);
}

const char *model_config_flavor(const struct model_config *c)
{
	return model_family_of(c->kind)->flavor(c);
}

int64_t model_config_n_layers(const struct model_config *c)
{
	return model_family_of(c->kind)->n_layers(c);
}

int64_t model_config_dim(const struct model_config *c)
{
	return model_family_of(c->kind)->dim(c);
}

int64_t model_count_valid(const int32_t *targets, int64_t n)
{
	int64_t v = 0;
	for (int64_t i = 0; i < n; i++)
		v += targets[i] != MODEL_IGNORE_INDEX;
	return v;
}

int model_table_build(struct param_table *t, const struct model_config *c)
{
	return model_family_of(c->kind)->table_build(t, c);
}

int model_table_build_tp(struct param_table *t, const struct model_config *c, int tp, int tp_rank)
{
	const struct model_family *f = model_family_of(c->kind);
	if (tp == 1)
		return f->table_build(t, c);
	CHECK(f->tp && f->table_build_tp, "model %s: no tensor-parallel table", f->name);
	return f->table_build_tp(t, c, tp, tp_rank);
}

int model_table_build_ep(struct param_table *t, const struct model_config *c, int ep, int ep_rank)
{
	const struct model_family *f = model_family_of(c->kind);
	if (ep <= 1)
		return f->table_build(t, c);
	CHECK(f->ep && f->table_build_ep, "model %s: no expert-parallel table", f->name);
	return f->table_build_ep(t, c, ep, ep_rank);
}

void model_init_params_cfg(const struct model_config *c, const struct param_table *t, uint64_t seed,
                           float *out, int64_t first, int64_t n)
{
	model_family_of(c->kind)->init_params(c, t, seed, out, first, n);
}

bool model_fp8_linear(const struct param_entry *e)
{
	return e->ndim == 2 && !e->high_precision && strncmp(e->name, "tok_embeddings", 14) != 0 &&
	       fp8_linear_wants(e->name);
}

/* Keeps the float8 registry (kernels/fp8_linear.h) in step with where unit u's parameters
 * are bound: its float8 linears' weights, found by the table, are registered at their new
 * addresses (a rebind to the same buffer, e.g. to attach gradients, keeps them as they are). */
void model_fp8_bind(const struct param_table *t, int u, const float *params,
                    const struct model_group *tp, const struct model_group *cp)
{
	/* context parallelism: the linears see this rank's tokens of the micro-batch, so their
	 * activations' tensorwise amaxes are maximised over the cp group (fp8_slice) */
	bool tok = cp && cp->size > 1;
	if (!fp8_linear_enabled() || fp8_linear_unit_is(u, params))
		return;
	fp8_linear_unit_clear(u);
	if (!params)
		return;
	fp8_linear_unit_set(u, params);
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *e = &t->p[i];
		if (!(e->unit == u && model_fp8_linear(e)))
			continue;
		/* a slice of the weight (tensor parallelism): its amaxes along the split
		 * dimension are maximised over the group, so every rank casts with the scale
		 * one rank would (kernels/fp8_linear.h) */
		bool split = tp && tp->size > 1 && e->tp_dim >= 0;
		struct fp8_slice sl = {.dim = split ? e->tp_dim : -1,
		                       .max_f32 = split ? tp->all_reduce_max_f32 : NULL,
		                       .ctx = split ? tp->ctx : NULL,
		                       .tok_max_f32 = tok ? cp->all_reduce_max_f32 : NULL,
		                       .tok_ctx = tok ? cp->ctx : NULL};
		fp8_linear_add(u, params + (e->offset - t->unit_begin[u]), e->shape[0],
		               e->shape[1], &sl);
	}
}

/* ---------------------------------------------------------------- build */

int model_build(struct model *m, const struct model_config *c, int64_t B, int64_t T,
                const struct model_build_opts *opts)
{
	memset(m, 0, sizeof(*m));
	int rc = model_family_of(c->kind)->build(m, c, B, T, opts);
	if (rc)
		return rc;
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
	model_family_of(m->cfg.kind)->describe(m, buf, n);
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
double model_unit_pass(const struct model_ops *ops, void *impl, int u, enum model_pass p, int op,
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
	return model_unit_pass(m->ops, m->impl, u, p, op, dscale, ran);
}
