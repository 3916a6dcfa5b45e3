/* parallel/pp_cost: the cost model of this pipeline's step, from the same schedule nodes the
 * executor runs (every pipeline rank's, sched_build_pp), calibrated here at the stage's
 * shapes. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "parallel/pp.h"
#include "parallel/step_plan.h"
#include "schedule/sched_cost.h"

int pp_cost_model(struct pp *pp, struct comm_stream *stream, struct sched_cost_model *cm,
                  struct sched_pp_link *link, struct sched_pp_prediction *pred)
{
	const struct mesh *mesh = pp->mesh;
	if (!model_family_of(pp->cfg.kind)->cost_model || mesh->tp > 1 || mesh->ep > 1) {
		LOG_WARN("cost model: not for this pipeline (%s)",
		         mesh->tp > 1   ? "tensor parallelism inside the stages is not modelled"
		         : mesh->ep > 1 ? "expert parallelism inside the stages is not modelled"
		                        : "the family has no cost model");
		return CT_ERR_USAGE;
	}
	/* the whole model's units, sharded over dp_shard x cp as the stages' shards are; a cp
	 * rank holds T / cp tokens of the sequence */
	const struct model_cost_shape sh = {.B = pp->o.micro_rows,
	                                    .T = pp->o.T * mesh->cp,
	                                    .ac = pp->o.ac,
	                                    .ac_every = pp->o.ac_every,
	                                    .tp = 1,
	                                    .elem_bytes = 4,
	                                    .cp = mesh->cp,
	                                    .cp_ring = pp->o.cp_ring,
	                                    .cp_headtail = pp->o.cp_headtail};
	/* the programs' K/V transfers, which the stages run inside their passes (unlowered) */
	step_plan_unit_progs(pp->step.units, pp->step.n_units, &pp->cfg, &sh, false);
	sched_cost_init(cm, &pp->cfg, &sh, &pp->step, mesh->shard, false);
	sched_cost_calibrate(cm, &pp->cfg, &sh, stream, &mesh->shard_group, &mesh->world_group,
	                     false, true);
	if (mesh->cp > 1) /* the K/V transfers inside the stages' attention */
		sched_cost_calibrate_cp(cm, &mesh->cp_group, &mesh->world_group, pp->o.sim_gbps,
		                        pp->o.sim_latency_us);
	cm->overlap = false; /* the stages' collectives run blocking (pp.c) */
	int64_t N = pp->o.micro_rows * pp->o.T;
	sched_cost_calibrate_pp_link(link, &mesh->pp_group, &mesh->world_group,
	                             N * model_config_dim(&pp->cfg) * (int64_t)sizeof(float),
	                             pp->o.sim_gbps, pp->o.sim_latency_us);
	link->host_load = comm_host_load();
	pp_predict(pp, cm, link, pred);
	return CT_OK;
}

void pp_predict(const struct pp *pp, const struct sched_cost_model *cm,
                const struct sched_pp_link *link, struct sched_pp_prediction *pred)
{
	struct sched *ranks = xcalloc((size_t)pp->p, sizeof(*ranks));
	for (int r = 0; r < pp->p; r++)
		sched_build_pp(&ranks[r], &pp->sched, r, pp->step.units, pp->step.n_units,
		               pp->stage_u0);
	sched_predict_pp(ranks, cm, link, pred);
	for (int r = 0; r < pp->p; r++)
		sched_free(&ranks[r]);
	free(ranks);
}
