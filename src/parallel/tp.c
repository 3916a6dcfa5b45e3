/* Tensor-parallel parameter layout. */
#include "parallel/tp.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

void tp_gather_global(const struct comm_group *g, const struct param_table *local,
                      const float *local_flat, const struct param_table *global, float *out)
{
	CHECK(local->count == global->count, "tp_gather_global: tables differ");
	int S = g->size;
	int64_t n = local->numel;
	float *all = malloc((size_t)(n * S) * sizeof(float));
	CHECK(all, "out of memory");
	comm_all_gather(g, local_flat, all, n * (int64_t)sizeof(float));
	for (int i = 0; i < local->count; i++) {
		const struct param_entry *p = &local->p[i], *gp = &global->p[i];
		int64_t rows = p->shape[0], cols = p->shape[1], gcols = gp->shape[1];
		for (int r = 0; r < (p->tp_dim < 0 ? 1 : S); r++) {
			const float *src = all + (int64_t)r * n + p->offset;
			if (p->tp_dim < 0) {
				memcpy(out + gp->offset, src, (size_t)p->numel * sizeof(float));
			} else if (p->tp_dim == 0) {
				int64_t start = r * rows, valid = gp->shape[0] - start;
				valid = valid < 0 ? 0 : (valid > rows ? rows : valid);
				memcpy(out + gp->offset + start * gcols, src,
				       (size_t)(valid * cols) * sizeof(float));
			} else {
				int64_t start = r * cols;
				for (int64_t row = 0; row < rows; row++)
					memcpy(out + gp->offset + row * gcols + start, src + row * cols,
					       (size_t)cols * sizeof(float));
			}
		}
	}
	free(all);
}
