/* schedule/sched_pass: passes over a schedule, each a pure function from one schedule to a
 * new one (the input is left unchanged), each in its own file:
 *
 *  - pass_ac.c: activation checkpointing (none | ffn | selective | full) — what is
 *    saved in forward and what is recomputed before backward (RECOMPUTE nodes), and, through
 *    sched_place_gathers, the gathered parameters: with reshard-after-forward the all-gather
 *    itself is recomputed in backward;
 *  - pass_bucket.c: bucketing — manual unit groups; pass_auto.c: the automatic plan (buckets,
 *    prefetch depth and deferral searched together with the cost model);
 *  - pass_reorder.c: reordering — prefetch all-gathers, defer reduce-scatter waits, within a
 *    memory budget.
 *
 * The pipeline is checkpoint → bucket → reorder → lower (sched_pipeline runs it from the config
 * strings). No pass changes any value a step computes: they only move and merge collectives
 * and choose what to recompute.
 */
#ifndef CT_SCHEDULE_SCHED_PASS_H
#define CT_SCHEDULE_SCHED_PASS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "schedule/schedule.h"

struct sched_cost_model;

void sched_pass_ac(const struct sched *in, enum model_ac ac, int ac_every, struct sched *out);

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

/* Automatic plan (pass_auto.c): choose the buckets (contiguous unit groups), the prefetch
 * depth (0..o->prefetch) and the reduce-scatter deferral (0..o->rs_defer) together, minimising
 * the cost model's predicted step (after reordering) with the predicted peak within
 * o->memory_bytes (if set). A bucket of more than one unit holds at most cap_bytes of gathered
 * parameters.
 *
 * Search: when the contiguous partitions under the cap, times the depth choices, number at
 * most SCHED_AUTO_EXHAUSTIVE, every one is evaluated (the result is optimal for the model).
 * Otherwise, per (prefetch, deferral): a dynamic program over partition prefixes (the best
 * plan of units [0, j) extended by a bucket [j, k), each candidate priced by the full timeline
 * with the rest completed as single units and as buckets of the same size), every uniform
 * plan (k units per bucket, embedding and norm alone or joined), then local search (move a
 * boundary, merge, split) from the best until no move helps. The report states a lower bound
 * on every plan's step (the compute nodes alone, the same in every plan) and the gap to it.
 *
 * Returns CT_ERR_USAGE (out left empty) when no plan fits the memory budget; the report then
 * holds the smallest predicted peak. */
#define SCHED_AUTO_EXHAUSTIVE 20000
#define SCHED_AUTO_TOP        5

struct sched_plan_eval {
	struct sched_bucket *buckets;
	int n_buckets, prefetch, rs_defer;
	double step_s, exposed_s;
	int64_t peak_bytes;
};

struct sched_auto_report {
	int n_top; /* plans that fit, best first */
	struct sched_plan_eval top[SCHED_AUTO_TOP];
	struct sched_plan_eval per_block; /* per-block at the configured depths */
	bool per_block_valid;
	int64_t n_evaluated;
	bool exhaustive;      /* every plan under the cap was evaluated */
	bool fits;            /* some plan fits the memory budget */
	int64_t min_peak;     /* smallest predicted peak of any plan evaluated */
	double lower_bound_s; /* no plan's predicted step is below this: the compute alone */
};

int sched_pass_auto(const struct sched *in, const struct sched_cost_model *cm,
                    const struct sched_reorder_opts *o, int64_t cap_bytes, struct sched *out,
                    struct sched_auto_report *report);
void sched_auto_report_free(struct sched_auto_report *r);
/* The plan as comm.buckets writes it ("per_block" when every bucket is one unit); at most
 * size - 1 characters, "..." when cut. */
void sched_plan_string(const struct sched_bucket *b, int n_buckets, int n_units, char *buf,
                       size_t size);
/* The plans compared, one line each (best first, then per-block for reference), each line
 * prefixed by indent. */
void sched_auto_report_print(const struct sched_auto_report *r, int n_units, FILE *f,
                             const char *indent);

/* checkpoint(ac, ac_every) → bucket(spec: "per_block", "auto" or groups) → reorder(o) → lower the
 * tensor-parallel collectives into nodes (sched_lower_tp). CT_ERR_USAGE
 * (message logged, naming comm.buckets or comm.memory_budget_gb) on a bad spec or when no
 * plan fits the budget. With "auto", report (may be NULL) receives the plans compared
 * (sched_auto_report_free); with a manual plan it is zeroed. */
int sched_pipeline(const struct sched *naive, enum model_ac ac, int ac_every, const char *buckets,
                   int64_t bucket_cap_bytes, const struct sched_reorder_opts *o,
                   const struct sched_cost_model *cm, struct sched *out,
                   struct sched_auto_report *report);

#endif
