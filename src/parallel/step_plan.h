/* parallel/step_plan: the training step's schedule and the cost model that prices it, from
 * options (train/step_config.h fills them from the run's config) — the naive step, activation
 * checkpointing, buckets, reordering and the lowering of the TP collectives into nodes.
 *
 * One sequence for both users: the trainer (FSDP runs the schedule; the cost model, when
 * needed, is calibrated on this machine: step_plan_setup) and `ctitan plan` (a model that is
 * not built, step_plan_naive_shapes; the target's rates are the caller's). Both build the
 * cost model with step_plan_cost_init and run the passes with step_plan_passes.
 */
#ifndef CT_PARALLEL_STEP_PLAN_H
#define CT_PARALLEL_STEP_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "model/model_cost.h"
#include "parallel/fsdp.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"

struct step_plan_opts {
	enum model_ac ac;         /* activation checkpointing */
	int ac_every;             /* with ac = MODEL_AC_LAYER: full on every ac_every-th block */
	const char *buckets;      /* "auto", "per_block" or unit groups (sched_bucket_plan_parse) */
	int64_t bucket_cap_bytes; /* auto: gathered bytes of a bucket of more than one unit */
	struct sched_reorder_opts reorder; /* prefetch, reduce-scatter deferral, memory budget */
	enum sched_reshard reshard;        /* the naive step's reshard-after-forward policy */
	bool bf16;                         /* bf16 compute and all-gather */
	bool tp_async; /* async TP: each TP collective as ring steps beside a matmul */
	bool profile;  /* profiled steps are compared with the cost model */
	bool overlap;  /* a progress thread runs the collectives beside compute */
	/* the data-parallel link: link_gbps > 0 gives it (Gbit/s + us), else it is measured */
	double link_gbps, link_latency_us;
	/* the simulated TP link (tp_sim_gbps > 0: TP collectives stretched to it), else the TP
	 * link is measured */
	double tp_sim_gbps, tp_sim_latency_us;
	/* context parallelism's K/V: round a ring (rotate method alltoall) or all-gathered;
	 * head-tail load balancing or contiguous shards */
	bool cp_ring, cp_headtail;
};

/* Where the step runs: micro-batches of B x T, accum of them per step and rank, on one of tp
 * tensor-parallel ranks and dp_shard FSDP shards, activations of elem_bytes per element; with
 * cp > 1 T is the whole sequence, of which this rank holds T / cp tokens (dp_shard: FSDP's
 * shards, which include the cp ranks). */
struct step_plan_layout {
	int64_t B, T, tp, dp_shard, elem_bytes;
	int accum;
	int64_t cp; /* 0 or 1: none */
	int64_t ep; /* expert-parallel ranks (0 or 1: none), borrowed from dp_shard */
};

/* The micro-batch and slice the family's cost figures are for. */
struct model_cost_shape step_plan_shape(const struct step_plan_opts *o,
                                        const struct step_plan_layout *l);

/* o->buckets must name n_units units (also checked on one rank, where no plan is parsed). */
int step_plan_check_buckets(const char *buckets, int n_units);

/* Whether the step needs a cost model (automatic buckets, a memory budget, or profiling of a
 * family that has one), and CT_ERR_USAGE (logged) when it does and c's family has none. */
int step_plan_needs_cost(const struct step_plan_opts *o, const struct model_config *c, bool *needs);

/* Every unit's pass programs (its TP collectives) from the shapes alone; none for tp 1. */
void step_plan_unit_progs(struct sched_unit *units, int n_units, const struct model_config *c,
                          const struct model_cost_shape *sh, bool async);

/* The naive step of a model that is not built (`ctitan plan`): tensor-parallel rank 0's slice
 * of c's table into *t (param_table_free it), its units sharded dim-0 over l->dp_shard with
 * their TP programs, l->accum micro-batches under o->reshard and o->ac. CT_ERR_USAGE (logged)
 * when the family cannot be sliced so (tp > 1 needs TP and a cost model). */
int step_plan_naive_shapes(const struct model_config *c, const struct step_plan_opts *o,
                           const struct step_plan_layout *l, struct param_table *t,
                           struct sched *naive);

/* The cost model of naive's step (sched_cost_init): the family's work and activation bytes
 * at l's shapes, the shard sizes, the all-gather dtype. Rates are left to the caller. */
void step_plan_cost_init(struct sched_cost_model *cm, const struct model_config *c,
                         const struct step_plan_opts *o, const struct step_plan_layout *l,
                         const struct sched *naive);
/* The data-parallel link o gives (nothing when link_gbps <= 0). */
void step_plan_cost_link(struct sched_cost_model *cm, const struct step_plan_opts *o);

/* checkpoint → bucket → reorder → lower (sched_pipeline) with o's choices. With "auto",
 * report (may be NULL) gets the plans compared (sched_auto_report_free). */
int step_plan_passes(const struct sched *naive, const struct step_plan_opts *o,
                     const struct sched_cost_model *cm, struct sched *out,
                     struct sched_auto_report *report);

/* Build the trainer's step for f (accum micro-batches) and set it. A cost model is built
 * when o needs one: compute rates and, unless o gives the link, collective costs are
 * measured on `stream` (median over the mesh's ranks). Then *cm holds it and *have_cm is
 * true (free with sched_cost_free). Logs the schedule and the prediction. Collective: every
 * rank calls it. */
int step_plan_setup(struct fsdp *f, const struct step_plan_opts *o, int accum,
                    struct comm_stream *stream, struct sched_cost_model *cm, bool *have_cm);

/* Log the plans the automatic search compared, one line each. */
void step_plan_log_report(const struct sched_auto_report *r, int n_units);

/* Log the cost model's prediction against a profiled step, per node kind. */
void step_plan_log_compare(const struct sched *s, const struct sched_cost_model *cm,
                           const struct sched_record *rec, double t0, double t1);

/* Print a prediction line for schedule s under cm (rank 0 logs it). */
void step_plan_log(const struct sched *s, const struct sched_cost_model *cm);

#endif
