/* model/model_hf: the family's Hugging Face interop (model/model_hf.h), through the table. */
#include "model/model_hf.h"

#include <string.h>

#include "base/log.h"
#include "model/model.h"

const struct model_hf_ops *model_hf_of(const struct model_config *c)
{
	const struct model_family *f = model_family_of(c->kind);
	return f->export_hf ? f->hf : NULL;
}

static const struct model_hf_ops *hf_ops(const struct model_config *c)
{
	const struct model_hf_ops *o = model_hf_of(c);
	CHECK(o, "model %s: no Hugging Face interop", model_kind_name(c->kind));
	return o;
}

bool model_hf_tensor(const struct model_config *c, const struct param_entry *e, const float *src,
                     float *tmp, char *name, size_t n, const float **data, int *ndim,
                     int64_t *shape)
{
	return hf_ops(c)->tensor(c, e, src, tmp, name, n, data, ndim, shape);
}

bool model_hf_extra(const struct model_config *c, const struct param_table *t,
                    const float *params, const double *state, int64_t n_state, int i,
                    char *name, size_t n, int *ndim, int64_t *shape, float **data)
{
	const struct model_hf_ops *o = hf_ops(c);
	return o->extra && o->extra(c, t, params, state, n_state, i, name, n, ndim, shape, data);
}

char *model_hf_config_json(const struct model_config *c)
{
	return hf_ops(c)->config_json(c);
}

int model_hf_load(const char *dir, const struct model_config *c, const struct param_table *t,
                  float *params, double *state, int64_t n_state)
{
	return hf_ops(c)->load(dir, c, t, params, state, n_state);
}

void model_hf_permute_rope_rows(const float *in, float *out, int64_t heads, int64_t D,
                                int64_t cols, bool to_hf)
{
	for (int64_t h = 0; h < heads; h++)
		for (int64_t i = 0; i < D / 2; i++)
			for (int64_t j = 0; j < 2; j++) {
				int64_t hf = h * D + j * (D / 2) + i, ct = h * D + 2 * i + j;
				memcpy(out + (to_hf ? hf : ct) * cols, in + (to_hf ? ct : hf) * cols,
				       (size_t)cols * sizeof(float));
			}
}
