/* optim/grad_norm: the tail every layout's step shares — this rank's share of the squared
 * global gradient norm, then loss, norm, the non-finite check and the clip coefficient.
 *
 * Each gradient element lives on exactly one (pipeline stage, shard) coordinate of the mesh
 * (HSDP replicas hold copies), so the layout sums this rank's share over its shard and stage
 * groups. Under tensor parallelism a TP-split tensor's rows or columns live on one TP rank and
 * a replicated one (tp_dim < 0: the norms) on all of them: the split part is summed over the
 * TP group and the replicated part counted once. */
#ifndef CT_OPTIM_GRAD_NORM_H
#define CT_OPTIM_GRAD_NORM_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "model/model.h"

/* Where this rank's slice of table tensor i is in the gradient buffer (element offset, and
 * element count); false: the tensor is not on this rank. */
typedef bool (*grad_slice_fn)(const void *ctx, int i, int64_t *at, int64_t *n);

/* This rank's share of the squared norm of g (n elements, this rank's slices of table t's
 * tensors). Without tensor parallelism (tp NULL or of one rank) the whole buffer in one sum;
 * with it, per tensor as above (collective over tp). */
double grad_norm_sumsq(const float *g, int64_t n, const struct param_table *t,
                       grad_slice_fn slice, const void *ctx, const struct comm_group *tp);

/* res from the step's loss sum, squared norm and valid tokens (all already global); the clip
 * coefficient for max_norm into *gscale. CT_ERR_RUNTIME, logged, on a non-finite loss or
 * norm (the step must not update then). */
int grad_norm_finish(struct train_step_result *res, double loss_sum, double sumsq, int64_t valid,
                     double max_norm, double *gscale);

#endif
