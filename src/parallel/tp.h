/* parallel/tp: tensor parallelism's parameter layout across the TP group (Megatron pieces
 * described by param_entry.tp_dim/tp_start/tp_valid, model/param_table.h, in the table
 * model_table_build_tp gives; the compute is the family's). */
#ifndef CT_PARALLEL_TP_H
#define CT_PARALLEL_TP_H

#include "comm/comm.h"
#include "model/param_table.h"

/* Assemble the global flat parameter buffer (layout of `global`, the tp_size = 1 table) from
 * every TP rank's local flat buffer (layout of `local`, identical sizes on every rank):
 * collective over g, every rank gets the result. Padding rows are dropped. */
void tp_gather_global(const struct comm_group *g, const struct param_table *local,
                      const float *local_flat, const struct param_table *global, float *out);

#endif
