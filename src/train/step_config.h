/* train/step_config: the step's schedule options (parallel/step_plan.h) from the run's config
 * — activation_checkpoint.mode, comm.buckets / bucket_cap_mb / prefetch /
 * reduce_scatter_defer / memory_budget_gb / progress / bandwidth_gbps / latency_us /
 * simulate_*, parallelism.fsdp_reshard_after_forward and enable_async_tensor_parallel,
 * profiling, the compute dtype — for the trainer and `ctitan plan` alike. */
#ifndef CT_TRAIN_STEP_CONFIG_H
#define CT_TRAIN_STEP_CONFIG_H

#include "io/config.h"
#include "parallel/step_plan.h"

/* CT_ERR_USAGE naming the key for a value the options cannot hold. o->buckets points into
 * cfg (it lives as long as cfg). */
int step_config_opts(const struct ct_config *cfg, struct step_plan_opts *o);

#endif
