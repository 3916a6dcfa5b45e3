#include "optim/grad_norm.h"

#include <math.h>

#include "base/log.h"
#include "comm/watchdog.h"
#include "kernels/kernels.h"
#include "optim/optim.h"

double grad_norm_sumsq(const float *g, int64_t n, const struct param_table *t,
                       grad_slice_fn slice, const void *ctx, const struct comm_group *tp)
{
	if (!tp || tp->size == 1)
		return sumsq_f32(g, n);
	double v[2] = {0.0, 0.0}; /* split, replicated */
	for (int i = 0; i < t->count; i++) {
		int64_t at, len;
		if (slice(ctx, i, &at, &len))
			v[t->p[i].tp_dim < 0] += sumsq_f32(g + at, len);
	}
	comm_label("gradient norm: TP-split tensors' sum of squares");
	comm_all_reduce_f64(tp, &v[0], 1);
	return v[0] + v[1];
}

int grad_norm_finish(struct train_step_result *res, double loss_sum, double sumsq, int64_t valid,
                     double max_norm, double *gscale)
{
	res->valid = valid;
	res->loss = valid > 0 ? loss_sum / (double)valid : 0.0;
	res->grad_norm = sqrt(sumsq);
	if (!isfinite(res->loss) || !isfinite(res->grad_norm)) {
		LOG_ERROR("non-finite %s (loss %g, grad norm %g); stopping",
		          isfinite(res->loss) ? "gradient norm" : "loss", res->loss,
		          res->grad_norm);
		return CT_ERR_RUNTIME;
	}
	*gscale = clip_coefficient(res->grad_norm, max_norm);
	return CT_OK;
}
