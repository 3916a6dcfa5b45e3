#include "model/param_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/rng.h"

void param_table_add(struct param_table *t, int *cap, const char *name, int unit, int64_t d0,
                     int64_t d1, bool decay, struct param_init init)
{
	if (t->count == *cap) {
		*cap = *cap ? 2 * *cap : 64;
		t->p = realloc(t->p, (size_t)*cap * sizeof(*t->p));
		CHECK(t->p, "out of memory");
	}
	struct param_entry *p = &t->p[t->count++];
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = d1 > 0 ? 2 : 1;
	p->shape[0] = d0;
	p->shape[1] = d1 > 0 ? d1 : 1;
	p->numel = d0 * p->shape[1];
	p->offset = t->numel;
	p->unit = unit;
	p->weight_decay = decay && p->ndim == 2;
	p->init = init;
	p->tp_dim = -1;
	p->tp_valid = d0;
	p->global_shape[0] = p->shape[0];
	p->global_shape[1] = p->shape[1];
	t->numel += p->numel;
}

void param_table_free(struct param_table *t)
{
	free(t->p);
	free(t->unit_begin);
	memset(t, 0, sizeof(*t));
}

const struct param_entry *param_table_find(const struct param_table *t, const char *name)
{
	for (int i = 0; i < t->count; i++)
		if (strcmp(t->p[i].name, name) == 0)
			return &t->p[i];
	return NULL;
}

void param_init_fill(const struct param_entry *p, uint64_t seed, float *dst, int64_t elem0,
                     int64_t cnt)
{
	const struct param_init *in = &p->init;
	uint64_t stream = rng_stream_id(p->name);
	switch (in->kind) {
	case PARAM_INIT_ZEROS:
	case PARAM_INIT_ONES:
	case PARAM_INIT_CONST: {
		float v = in->kind == PARAM_INIT_ZEROS  ? 0.0f
		          : in->kind == PARAM_INIT_ONES ? 1.0f
		                                        : (float)in->a;
		for (int64_t j = 0; j < cnt; j++)
			dst[j] = v;
		break;
	}
	case PARAM_INIT_NORMAL:
		rng_fill_normal(dst, cnt, elem0, seed, stream, 0.0, in->a);
		break;
	case PARAM_INIT_TRUNC_NORMAL:
		rng_fill_trunc_normal(dst, cnt, elem0, seed, stream, in->a, -in->cut, in->cut);
		break;
	case PARAM_INIT_UNIFORM:
		for (int64_t j = 0; j < cnt; j++)
			dst[j] =
			    (float)(in->a *
			            (2.0 * rng_uniform(seed, stream, (uint64_t)(elem0 + j)) - 1.0));
		break;
	}
}

void param_table_init_range(const struct param_table *t, uint64_t seed, float *out, int64_t first,
                            int64_t n)
{
	int64_t last = first + n;
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i];
		int64_t lo = p->offset > first ? p->offset : first;
		int64_t hi = p->offset + p->numel < last ? p->offset + p->numel : last;
		if (lo < hi)
			param_init_fill(p, seed, out + (lo - first), lo - p->offset, hi - lo);
	}
}
