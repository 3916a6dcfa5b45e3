#include "train/optim.h"

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

void adamw_step(struct adamw *o, const struct llama_table *t, float *params, const float *grads,
		int64_t first, int64_t n, double lr, double gscale)
{
	o->t++;
	int64_t last = first + n;
	for (int i = 0; i < t->count; i++) {
		const struct llama_param *p = &t->p[i];
		int64_t lo = p->offset > first ? p->offset : first;
		int64_t hi = p->offset + p->numel < last ? p->offset + p->numel : last;
		if (lo >= hi)
			continue;
		int64_t at = lo - first;
		adamw_update(params + at, grads + at, o->m + at, o->v + at, hi - lo, lr, o->beta1,
			     o->beta2, o->eps, p->weight_decay ? o->weight_decay : 0.0, o->t, gscale);
	}
}

double clip_coefficient(double total_norm, double max_norm)
{
	double c = max_norm / (total_norm + 1e-6);
	return c < 1.0 ? c : 1.0;
}
