/* optim/optim: AdamW over a flat parameter buffer described by the model's table (weight
 * decay on matrices only), and global-norm gradient clipping. The moments m and v mirror the
 * parameter buffer (or, under FSDP, this rank's shard of it). */
#ifndef CT_OPTIM_OPTIM_H
#define CT_OPTIM_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "model/llama/llama.h"

struct adamw {
	double beta1, beta2, eps, weight_decay;
	int64_t numel;
	int64_t t; /* steps taken */
	float *m, *v;
};

void adamw_init(struct adamw *o, int64_t numel, double beta1, double beta2, double eps,
                double weight_decay);
void adamw_free(struct adamw *o);
/* One step over the whole flat buffers of a table, with gradients multiplied by gscale (the
 * clipping coefficient). */
void adamw_step(struct adamw *o, const struct param_table *t, float *params, const float *grads,
                double lr, double gscale);
/* The same step by pieces (e.g. this rank's shards): begin once, then update each slice;
 * `at` is the slice's offset in the moment buffers. */
void adamw_begin_step(struct adamw *o);
void adamw_update_slice(struct adamw *o, float *params, const float *grads, int64_t at, int64_t n,
                        double lr, bool decay, double gscale);

/* torch.nn.utils.clip_grad_norm_: coefficient min(1, max_norm / (norm + 1e-6)). */
double clip_coefficient(double total_norm, double max_norm);

#endif
