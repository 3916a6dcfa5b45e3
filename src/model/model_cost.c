/* model/model_cost: the family's cost-model figures (model/model_cost.h), through the table. */
#include "model/model_cost.h"

#include <string.h>

#include "base/log.h"
#include "model/model.h"

const struct model_cost_ops *model_cost_of(const struct model_config *c)
{
	const struct model_family *f = model_family_of(c->kind);
	return f->cost_model ? f->cost : NULL;
}

static const struct model_cost_ops *cost_ops(const struct model_config *c)
{
	const struct model_cost_ops *o = model_cost_of(c);
	CHECK(o, "model %s: no cost model", model_kind_name(c->kind));
	return o;
}

void model_cost_unit_work(const struct model_config *c, const struct model_cost_shape *s, int u,
                          model_cost_work w)
{
	memset(w, 0, sizeof(model_cost_work));
	cost_ops(c)->unit_work(c, s, u, w);
}

int64_t model_cost_activation_bytes(const struct model_config *c, const struct model_cost_shape *s)
{
	return cost_ops(c)->activation_bytes(c, s);
}

double model_cost_flops_per_token(const struct model_config *c, int64_t seq_len)
{
	return cost_ops(c)->flops_per_token(c, seq_len);
}

void model_cost_unit_prog(const struct model_config *c, const struct model_cost_shape *s,
                          bool async, int u, enum model_pass p, struct model_prog *out)
{
	memset(out, 0, sizeof(*out));
	if (s->tp > 1) /* without tensor parallelism every pass is one segment */
		cost_ops(c)->unit_prog(c, s, async, u, p, out);
}

void model_cost_unit_inner(const struct model_config *c, const struct model_cost_shape *s, int u,
                           enum model_pass p, struct model_prog *out)
{
	memset(out, 0, sizeof(*out));
	if ((s->cp > 1 || s->ep > 1) && cost_ops(c)->unit_inner)
		cost_ops(c)->unit_inner(c, s, u, p, out);
}

void model_cost_calib_init(struct model_cost_calib *cal, const struct model_config *c,
                           const struct model_cost_shape *s)
{
	memset(cal, 0, sizeof(*cal));
	cost_ops(c)->calib_init(cal, c, s);
	CHECK(cal->n_parts > 0 && cal->n_parts <= MODEL_COST_PARTS_MAX && cal->busy_part >= 0 &&
	          cal->busy_part < cal->n_parts,
	      "model %s: calibration of %d parts (busy part %d)", model_kind_name(c->kind),
	      cal->n_parts, cal->busy_part);
}

void model_cost_calib_free(struct model_cost_calib *cal)
{
	if (cal->free)
		cal->free(cal->impl);
	memset(cal, 0, sizeof(*cal));
}
