/* schedule/sched_trace: a step's executed schedule as a Chrome trace (Trace Event Format,
 * opens in Perfetto and chrome://tracing).
 *
 * One process per rank (pid = rank) with two tracks: "compute" (tid 1: FWD, BWD, RECOMPUTE,
 * BATCH, CLIP, OPTIM, the copy-in of issued collectives, WAITs as blocked time) and "comm"
 * (tid 2: each collective from when the comm stream started it to when it finished, with the
 * bucket, its units and bytes in args). Times are microseconds from t_base.
 */
#ifndef CT_SCHEDULE_SCHED_TRACE_H
#define CT_SCHEDULE_SCHED_TRACE_H

#include <stdio.h>

#include "schedule/sched_exec.h"
#include "schedule/schedule.h"

/* CT_OK or CT_ERR_RUNTIME with a message naming the file. */
int sched_trace_write(const char *path, const struct sched *s, const struct sched_record *rec,
                      int rank, double t_base);

/* Predicted vs measured time per node kind for one executed step (rec), one line each into f:
 * compute split by unit type (embedding, blocks, head), collective issue, exposed waits, the
 * tail, and what ran outside the schedule (data, gradient zeroing), with the step itself
 * (t_step0: when the step began, t_step1: when it ended). */
struct sched_cost_model;
void sched_profile_compare(const struct sched *s, const struct sched_cost_model *cm,
                           const struct sched_record *rec, double t_step0, double t_step1, FILE *f);

#endif
