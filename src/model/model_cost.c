/* model/model_cost: the family's cost-model figures (model/model_cost.h), through the table. */
#include "model/model_cost.h"

#include <stdlib.h>
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
	if (s->tp > 1 || s->ep > 1 || s->cp > 1) /* without tensor, expert or context
	                                            parallelism every pass is one segment */
		cost_ops(c)->unit_prog(c, s, async, u, p, out);
}

void model_cost_unit_inner(const struct model_config *c, const struct model_cost_shape *s, int u,
                           enum model_pass p, struct model_prog *out)
{
	memset(out, 0, sizeof(*out));
	if ((s->ep > 1 || s->tp > 1) && cost_ops(c)->unit_inner)
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

float *model_cost_cal_buffers(const struct model_cost_view *views, size_t n_views, int32_t **tok,
                              int64_t N, int64_t V)
{
	int64_t total = 0;
	for (size_t i = 0; i < n_views; i++)
		total += (views[i].n + 15) / 16 * 16; /* 64-byte aligned views (FFTW's buffers) */
	float *all = aligned_alloc(64, (size_t)(total > 0 ? total : 16) * sizeof(float));
	*tok = malloc((size_t)(N > 0 ? N : 1) * sizeof(int32_t));
	CHECK(all && *tok, "out of memory (cost model calibration, %lld floats)", (long long)total);
	for (int64_t i = 0; i < total; i++)
		all[i] = (float)((i * 7919) % 1000) * 1e-4f - 0.05f;
	for (int64_t i = 0; i < N; i++)
		(*tok)[i] = (int32_t)((i * 104729) % V);
	float *at = all;
	for (size_t i = 0; i < n_views; i++) {
		*views[i].p = at;
		at += (views[i].n + 15) / 16 * 16;
	}
	return all;
}
