/* schedule/sched_pass: passes over a schedule, each a pure function from one schedule to a
 * new one (the input is left unchanged), each in its own file:
 *
 *  - pass_checkpoint.c: activation checkpointing (none | ffn | selective | full) — what is
 *    saved in forward and what is recomputed before backward (RECOMPUTE nodes), and, through
 *    sched_place_gathers, the gathered parameters: with reshard-after-forward the all-gather
 *    itself is recomputed in backward;
 *  - pass_bucket.c: bucketing — manual unit groups, or automatic (greedy with the cost model);
 *  - pass_reorder.c: reordering — prefetch all-gathers, defer reduce-scatter waits, within a
 *    memory budget.
 *
 * The pipeline is checkpoint → bucket → reorder (sched_pipeline runs it from the config
 * strings). No pass changes any value a step computes: they only move and merge collectives
 * and choose what to recompute.
 */
#ifndef CT_SCHEDULE_SCHED_PASS_H
#define CT_SCHEDULE_SCHED_PASS_H

#include <stdint.h>

#include "schedule/schedule.h"

struct sched_cost_model;

void sched_pass_checkpoint(const struct sched *in, enum model_ac ac, struct sched *out);

/* Parse a bucket plan: "per_block" (one bucket per unit: embedding, each block, norm +
 * output), or comma-separated groups of '+'-joined units — "embed", block indices from 0,
 * "norm" (final norm + output) — that tile the units in order, e.g. "embed+0,1,2+3+norm".
 * Returns CT_OK, or CT_ERR_USAGE with a message in why. *buckets is malloc'd. */
int sched_bucket_plan_parse(const char *spec, int n_units, struct sched_bucket **buckets,
                            int *n_buckets, char *why, size_t why_size);
/* Rebucket: merge the collectives of each group into one (all-gathers and their waits at the
 * group's first, reduce-scatters and their waits at its last backward unit). */
void sched_pass_bucket(const struct sched *in, const struct sched_bucket *buckets, int n_buckets,
                       struct sched *out);

struct sched_reorder_opts {
	int prefetch;         /* issue each all-gather this many gathers ahead (0: at use) */
	int rs_defer;         /* wait for a reduce-scatter this many reduce-scatters later */
	int64_t memory_bytes; /* peak memory budget per rank (0: none); needs a cost model */
};
void sched_pass_reorder(const struct sched *in, const struct sched_reorder_opts *o,
                        const struct sched_cost_model *cm, struct sched *out);

/* Automatic bucketing (SimpleFSDP-style greedy): walk the units in order and grow the current
 * bucket while that makes the cost model's predicted step (after reordering with o) faster by
 * more than 0.5% — its communication still hides behind the compute it overlaps and one
 * collective's latency is saved — the bucket stays under cap_bytes of gathered parameters,
 * and predicted peak memory stays within o->memory_bytes (if set). */
void sched_pass_bucket_auto(const struct sched *in, const struct sched_cost_model *cm,
                            const struct sched_reorder_opts *o, int64_t cap_bytes,
                            struct sched *out);

/* checkpoint(ac) → bucket(spec: "per_block", "auto" or groups) → reorder(o). CT_ERR_USAGE
 * (message logged, naming comm.buckets) on a bad spec. */
int sched_pipeline(const struct sched *naive, enum model_ac ac, const char *buckets,
                   int64_t bucket_cap_bytes, const struct sched_reorder_opts *o,
                   const struct sched_cost_model *cm, struct sched *out);

#endif
