/* cli/plan_pp: `ctitan plan` for pipeline-parallel layouts (pp x tp x dp_replicate x
 * dp_shard): the pipeline schedule simulated with predicted stage times, bubble fraction,
 * in-flight activation memory per rank, step time and tokens/s per GPU. */
#ifndef CT_CLI_PLAN_PP_H
#define CT_CLI_PLAN_PP_H

#include <stdbool.h>
#include <stdint.h>

#include "io/config.h"

int plan_pp_run(const struct ct_config *cfg, int64_t world, bool all_nodes);

#endif
