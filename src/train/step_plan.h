/* train/step_plan: the training step's schedule from the config — activation checkpointing,
 * buckets, reordering and the cost model — shared by the trainer (which calibrates the cost
 * model on this machine) and `ctitan plan` (which takes the target's figures from the config).
 */
#ifndef CT_TRAIN_STEP_PLAN_H
#define CT_TRAIN_STEP_PLAN_H

#include <stdbool.h>
#include <stdio.h>

#include "io/config.h"
#include "parallel/fsdp.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"

/* activation_checkpoint.mode as the schedule's enum (CT_ERR_USAGE naming the key). */
int step_plan_ac(const struct ct_config *cfg, enum model_ac *ac);
void step_plan_reorder_opts(const struct ct_config *cfg, struct sched_reorder_opts *o);

/* comm.buckets must name n_units units (also checked on one rank, where no schedule runs). */
int step_plan_check_buckets(const struct ct_config *cfg, int n_units);

/* Build the step's schedule for f (accum micro-batches) and set it. A cost model is built
 * when the config needs one (comm.buckets = "auto", a memory budget, profiling): compute
 * rates and, unless comm.bandwidth_gbps is given, collective costs are measured on `stream`
 * (median over the mesh's ranks). Then *cm holds it and *have_cm is true (free with
 * sched_cost_free). Collective: every rank calls it. */
int step_plan_setup(struct fsdp *f, const struct ct_config *cfg, int accum,
                    struct comm_stream *stream, struct sched_cost_model *cm, bool *have_cm);

/* Log the plans the automatic search compared, one line each. */
void step_plan_log_report(const struct sched_auto_report *r, int n_units);

/* Log the cost model's prediction against a profiled step, per node kind. */
void step_plan_log_compare(const struct sched *s, const struct sched_cost_model *cm,
                           const struct sched_record *rec, double t0, double t1);

/* Print a prediction line for schedule s under cm (rank 0 logs it). */
void step_plan_log(const struct sched *s, const struct sched_cost_model *cm);

#endif
