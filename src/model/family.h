/* model/family: what a family's implementation (src/model/<family>/) shares with the
 * model interface (model/model.c). Not for the layers above. */
#ifndef CT_MODEL_FAMILY_H
#define CT_MODEL_FAMILY_H

#include "model/model.h"

/* The kind of a family in the table (its index; CHECK: it is in the table). */
enum model_kind model_family_kind(const struct model_family *f);

/* The family with a preset of that name (NULL: none). */
const struct model_family *model_family_of_flavor(const char *flavor);

/* A one-segment program's op 0: the whole pass through ops (model_ops.unit_op's default). */
double model_unit_pass(const struct model_ops *ops, void *impl, int u, enum model_pass p, int op,
                       double dscale, bool *ran);
/* Keep the float8 registry (kernels/fp8_linear.h) in step with where unit u's parameters are
 * bound (a family whose linears may be float8 calls it from bind_unit); tp: the group that
 * splits its weights (NULL or size 1: whole weights); cp: the group that splits the tokens of
 * the micro-batch (context parallelism; NULL or size 1: none). */
void model_fp8_bind(const struct param_table *t, int u, const float *params,
                    const struct model_group *tp, const struct model_group *cp);

#endif
