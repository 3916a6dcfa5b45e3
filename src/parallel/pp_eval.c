/* parallel/pp_eval: a pipeline's validation loss (the forward-only schedule over the same
 * stages, parallel/pp.h) and the measurements of its last step (bubble, transfer waits). */
#include "parallel/pp.h"

#include "base/log.h"

/* ---------------------------------------------------------------- evaluation */

double pp_eval_loss(struct pp *pp, const int32_t *tokens, const int32_t *targets, double *sum,
                    int64_t *valid)
{
	const struct mesh *mesh = pp->mesh;
	/* the step's per-step state, restored after: a later step's begin sets it anew, but
	 * its metrics may still be read between */
	double loss_sum = pp->loss_sum, dscale = pp->dscale;
	int64_t step_valid = pp->valid;
	const int32_t *tok = pp->tokens, *tgt = pp->targets;
	pp->eval = true;
	pp->tokens = tokens;
	pp->targets = targets;
	pp->dscale = 0; /* no loss gradient */
	pp->loss_sum = 0;
	pp->valid = 0;
	pp_pull_state(pp);
	struct engine e;
	pp_engine(pp, &e);
	CHECK(sched_exec_run(&pp->eval_step, &e.be, NULL, NULL) == CT_OK, "pp: evaluation");
	/* the loss lives on the last stage (and MoE's auxiliary loss on every stage with MoE
	 * blocks), whole on each TP rank: TP rank 0 counts; the valid tokens on the last */
	bool counts = pp->vstages[pp->v - 1].stage == pp->S - 1 && mesh->tp_rank == 0;
	double s[2] = {mesh->tp_rank == 0 ? pp->loss_sum : 0.0, counts ? (double)pp->valid : 0.0};
	comm_all_reduce_f64(&mesh->world_group, s, 2);
	pp->eval = false;
	pp->tokens = tok;
	pp->targets = tgt;
	pp->dscale = dscale;
	pp->loss_sum = loss_sum;
	pp->valid = step_valid;
	if (sum)
		*sum = s[0];
	if (valid)
		*valid = (int64_t)s[1];
	return s[1] > 0 ? s[0] / s[1] : 0.0;
}

/* The span of the last step's pipeline: from its first action to its last send's wait. */
static void pp_span(const struct pp *pp, double *t0, double *t1)
{
	*t0 = *t1 = 0;
	bool first = true;
	for (int i = 0; i < pp->step.n_nodes; i++) {
		const struct sched_node *n = &pp->step.nodes[i];
		bool pp_node = sched_kind_pp(n->kind) ||
		               (n->kind == SCHED_WAIT && sched_kind_pp(n->wait_kind));
		if (!pp_node)
			continue;
		if (first)
			*t0 = pp->rec[i].t0;
		first = false;
		*t1 = pp->rec[i].t1;
	}
}

double pp_measured_bubble(const struct pp *pp)
{
	double busy = 0, t0, t1;
	pp_span(pp, &t0, &t1);
	for (int i = 0; i < pp->step.n_nodes; i++)
		if (sched_kind_pp_compute(pp->step.nodes[i].kind))
			busy += pp->rec[i].t1 - pp->rec[i].t0;
	return t1 > t0 ? 1.0 - busy / (t1 - t0) : 0.0;
}

double pp_wait_seconds(const struct pp *pp)
{
	double w = 0;
	for (int i = 0; i < pp->step.n_nodes; i++) {
		const struct sched_node *n = &pp->step.nodes[i];
		if (n->kind == SCHED_WAIT && sched_kind_pp(n->wait_kind))
			w += pp->rec[i].t1 - pp->rec[i].t0;
	}
	return w;
}
