#include "optim/optim.h"

#include <string.h>

#include "base/mem.h"
#include "kernels/kernels.h"

void adamw_init(struct adamw *o, int64_t numel, double beta1, double beta2, double eps,
                double weight_decay)
{
	memset(o, 0, sizeof(*o));
	o->beta1 = beta1;
	o->beta2 = beta2;
	o->eps = eps;
	o->weight_decay = weight_decay;
	o->numel = numel;
	o->m = mem_alloc(MEM_OPTIM, (size_t)numel * sizeof(float));
	o->v = mem_alloc(MEM_OPTIM, (size_t)numel * sizeof(float));
}

void adamw_free(struct adamw *o)
{
	mem_free(MEM_OPTIM, o->m, (size_t)o->numel * sizeof(float));
	mem_free(MEM_OPTIM, o->v, (size_t)o->numel * sizeof(float));
	memset(o, 0, sizeof(*o));
}

void adamw_begin_step(struct adamw *o)
{
	o->t++;
}

void adamw_update_slice(struct adamw *o, float *params, const float *grads, int64_t at, int64_t n,
                        double lr, bool decay, double gscale)
{
	adamw_update(params, grads, o->m + at, o->v + at, n, lr, o->beta1, o->beta2, o->eps,
	             decay ? o->weight_decay : 0.0, o->t, gscale);
}

void adamw_step(struct adamw *o, const struct param_table *t, float *params, const float *grads,
                double lr, double gscale)
{
	adamw_begin_step(o);
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i];
		adamw_update_slice(o, params + p->offset, grads + p->offset, p->offset, p->numel,
		                   lr, p->weight_decay, gscale);
	}
}

double clip_coefficient(double total_norm, double max_norm)
{
	double c = max_norm / (total_norm + 1e-6);
	return c < 1.0 ? c : 1.0;
}
