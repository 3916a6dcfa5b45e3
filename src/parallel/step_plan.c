/* parallel/step_plan: options → naive step → cost model → passes → FSDP's schedule. */
#include "parallel/step_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "schedule/sched_trace.h"

struct model_cost_shape step_plan_shape(const struct step_plan_opts *o,
                                        const struct step_plan_layout *l)
{
	return (struct model_cost_shape){.B = l->B,
	                                 .T = l->T,
	                                 .ac = o->ac,
	                                 .ac_every = o->ac_every,
	                                 .tp = l->tp,
	                                 .elem_bytes = l->elem_bytes,
	                                 .cp = l->cp > 1 ? l->cp : 1,
	                                 .cp_ring = o->cp_ring,
	                                 .cp_headtail = o->cp_headtail,
	                                 .ep = l->ep > 1 ? l->ep : 1};
}

int step_plan_check_buckets(const char *buckets, int n_units)
{
	if (strcmp(buckets, "auto") == 0)
		return CT_OK;
	struct sched_bucket *plan;
	int nb;
	char why[256];
	if (sched_bucket_plan_parse(buckets, n_units, &plan, &nb, why, sizeof(why))) {
		LOG_ERROR("comm.buckets: '%s': %s", buckets, why);
		return CT_ERR_USAGE;
	}
	free(plan);
	return CT_OK;
}

int step_plan_needs_cost(const struct step_plan_opts *o, const struct model_config *c, bool *needs)
{
	bool has = model_cost_of(c) != NULL;
	/* profiling compares the step with the cost model where the family has one */
	*needs =
	    strcmp(o->buckets, "auto") == 0 || o->reorder.memory_bytes > 0 || (o->profile && has);
	if (*needs && !has) {
		LOG_ERROR("comm.buckets = \"auto\", comm.memory budget and profiling need the cost "
		          "model, which model.name = \"%s\" does not have",
		          model_kind_name(c->kind));
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

void step_plan_unit_progs(struct sched_unit *units, int n_units, const struct model_config *c,
                          const struct model_cost_shape *sh, bool async)
{
	for (int u = 0; u < n_units; u++)
		for (int p = 0; p < MODEL_PASS_COUNT; p++)
			model_cost_unit_prog(c, sh, async, u, (enum model_pass)p,
			                     &units[u].prog[p]);
}

int step_plan_naive_shapes(const struct model_config *c, const struct step_plan_opts *o,
                           const struct step_plan_layout *l, struct param_table *t,
                           struct sched *naive)
{
	const struct model_family *fam = model_family_of(c->kind);
	if (l->tp > 1 && (!fam->tp || !model_cost_of(c))) { /* its programs come from the shapes */
		LOG_ERROR("parallelism.tensor_parallel_degree = %lld: not supported for "
		          "model.name = \"%s\" (the family has no tensor-parallel form or no cost "
		          "model to plan one)",
		          (long long)l->tp, fam->name);
		return CT_ERR_USAGE;
	}
	if (l->ep > 1 && (!fam->ep || l->dp_shard % l->ep)) {
		LOG_ERROR("parallelism.expert_parallel_degree = %lld: not supported for model.name = "
		          "\"%s\" or not a divisor of the FSDP shards (%lld)",
		          (long long)l->ep, fam->name, (long long)l->dp_shard);
		return CT_ERR_USAGE;
	}
	/* a TP rank's slice (or ep rank 0's experts), FSDP-sharded */
	int rc = l->ep > 1 ? model_table_build_ep(t, c, (int)l->ep, 0)
	                   : model_table_build_tp(t, c, (int)l->tp, 0);
	if (rc)
		return rc;
	struct sched_unit *units = xcalloc((size_t)t->n_units, sizeof(*units));
	sched_units_from_table(t, l->dp_shard, units);
	if (l->ep > 1) { /* expert tensors: over the efsdp group of dp_shard / ep (fsdp.c) */
		for (int u = 0; u < t->n_units; u++)
			units[u].shard_numel = 0;
		for (int i = 0; i < t->count; i++) {
			const struct param_entry *p = &t->p[i];
			int64_t rows = p->shape[0], cols = p->numel / rows;
			int64_t g = p->expert ? l->dp_shard / l->ep : l->dp_shard;
			int64_t chunk = (rows + g - 1) / g * cols;
			units[p->unit].shard_numel += chunk;
			units[p->unit].peer_numel += (g - 1) * chunk;
		}
	}
	const struct model_cost_shape sh = step_plan_shape(o, l);
	step_plan_unit_progs(units, t->n_units, c, &sh, o->tp_async);
	sched_build(naive, units, t->n_units, l->accum, o->reshard);
	free(units);
	/* as fsdp_naive_schedule: the model's checkpointing is part of the step */
	if (o->ac != MODEL_AC_NONE) {
		struct sched next;
		sched_pass_ac(naive, o->ac, o->ac_every, &next);
		sched_replace(naive, &next);
	}
	return CT_OK;
}

void step_plan_cost_init(struct sched_cost_model *cm, const struct model_config *c,
                         const struct step_plan_opts *o, const struct step_plan_layout *l,
                         const struct sched *naive)
{
	/* a TP rank computes its slice of the shapes (sequence-parallel norms: 1/tp) */
	const struct model_cost_shape sh = step_plan_shape(o, l);
	sched_cost_init(cm, c, &sh, naive, l->dp_shard, o->bf16);
}

void step_plan_cost_link(struct sched_cost_model *cm, const struct step_plan_opts *o)
{
	if (o->link_gbps <= 0)
		return;
	cm->ag_bytes_s = cm->rs_bytes_s = o->link_gbps * 1e9 / 8.0;
	cm->ag_latency_s = cm->rs_latency_s = o->link_latency_us * 1e-6;
}

int step_plan_passes(const struct sched *naive, const struct step_plan_opts *o,
                     const struct sched_cost_model *cm, struct sched *out,
                     struct sched_auto_report *report)
{
	return sched_pipeline(naive, o->ac, o->ac_every, o->buckets, o->bucket_cap_bytes, &o->reorder, cm, out,
	                      report);
}

void step_plan_log(const struct sched *s, const struct sched_cost_model *cm)
{
	struct sched_prediction p;
	sched_predict(s, cm, &p, NULL);
	if (cm->single)
		LOG_INFO("cost model: step %.3f s (compute %.3f s; one process: no collectives), "
		         "peak %.2f GiB",
		         p.step_s, p.compute_s, (double)p.peak_bytes / (1 << 30));
	else
		LOG_INFO(
		    "cost model: step %.3f s (compute %.3f s, comm %.3f s, exposed %.3f s), "
		    "peak %.2f GiB/rank; all-gather %.0f us + %.2f GB/s, reduce-scatter %.0f us "
		    "+ %.2f GB/s; comm thread CPU %.3f s, compute loses %.0f%% of it (%.3f s)",
		    p.step_s, p.compute_s, p.comm_s, p.exposed_s, (double)p.peak_bytes / (1 << 30),
		    cm->ag_latency_s * 1e6, cm->ag_bytes_s / 1e9, cm->rs_latency_s * 1e6,
		    cm->rs_bytes_s / 1e9, p.comm_cpu_s,
		    100.0 * (cm->overlap ? cm->interference : 0.0), p.comm_cpu_paid_s);
	if (cm->cp_bytes_s > 0)
		LOG_INFO("cost model: context-parallel K/V transfers %.3f s of the step on the "
		         "compute thread (schedule nodes; %.3f s on the wire, %.1f MiB sent), link "
		         "%.0f us + %.2f GB/s",
		         p.cp_s, p.cp_comm_s, (double)p.cp_wire_bytes / 1048576.0,
		         cm->cp_latency_s * 1e6, cm->cp_bytes_s / 1e9);
	if (cm->inner && cm->ep_bytes_s > 0)
		LOG_INFO("cost model: expert-parallel all-to-alls %.3f s of the step in the MoE "
		         "passes (%lld of them, %.1f MiB sent), link %.0f us + %.2f GB/s",
		         p.ep_s, (long long)p.n_ep, (double)p.ep_wire_bytes / 1048576.0,
		         cm->ep_latency_s * 1e6, cm->ep_bytes_s / 1e9);
	if (cm->tp_bytes_s > 0)
		LOG_INFO(
		    "cost model: tensor-parallel collectives %.3f s of the step on the compute "
		    "thread (schedule nodes), link %.0f us + %.2f GB/s",
		    p.tp_s, cm->tp_latency_s * 1e6, cm->tp_bytes_s / 1e9);
	const double(*r)[SCHED_TERM_COUNT] = cm->rate;
	LOG_INFO(
	    "cost model rates: matmul fwd %.1f bwd %.1f GFLOP/s, attention fwd %.1f bwd "
	    "%.1f GFLOP/s, output+loss %.1f GFLOP/s, elementwise fwd %.1f bwd %.1f GB/s, "
	    "embedding %.1f GB/s, AdamW %.1f GB/s, copies %.1f GB/s",
	    r[SCHED_WORK_FWD][SCHED_TERM_MATMUL] / 1e9, r[SCHED_WORK_BWD][SCHED_TERM_MATMUL] / 1e9,
	    r[SCHED_WORK_FWD][SCHED_TERM_ATTN] / 1e9, r[SCHED_WORK_BWD][SCHED_TERM_ATTN] / 1e9,
	    r[SCHED_WORK_FWD][SCHED_TERM_HEAD] / 1e9, r[SCHED_WORK_FWD][SCHED_TERM_ELEM] / 1e9,
	    r[SCHED_WORK_BWD][SCHED_TERM_ELEM] / 1e9, r[SCHED_WORK_FWD][SCHED_TERM_EMBED] / 1e9,
	    cm->optim_bytes_s / 1e9, cm->mem_bytes_s / 1e9);
}

static void log_lines(char *text)
{
	for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
		nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		LOG_INFO("%s", line);
	}
	free(text);
}

void step_plan_log_report(const struct sched_auto_report *r, int n_units)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return;
	sched_auto_report_print(r, n_units, f, "");
	fclose(f);
	log_lines(text);
}

void step_plan_log_compare(const struct sched *s, const struct sched_cost_model *cm,
                           const struct sched_record *rec, double t0, double t1)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return;
	sched_profile_compare(s, cm, rec, t0, t1, f);
	fclose(f);
	log_lines(text);
}

int step_plan_setup(struct fsdp *f, const struct step_plan_opts *o, int accum,
                    struct comm_stream *stream, struct sched_cost_model *cm, bool *have_cm)
{
	struct model *m = f->model;
	CHECK((enum sched_reshard)f->reshard == o->reshard && m->ac == o->ac &&
	          m->ac_every == o->ac_every,
	      "step plan: options and FSDP disagree on resharding or checkpointing");
	int rc = step_plan_needs_cost(o, &m->cfg, have_cm);
	if (rc)
		return rc;
	struct sched naive, s;
	fsdp_naive_schedule(f, accum, &naive);
	if (*have_cm) {
		/* the model holds T / cp tokens; FSDP shards over dp_shard x cp */
		const struct step_plan_layout l = {.B = m->B,
		                                   .T = m->T * f->mesh->cp,
		                                   .tp = f->mesh->tp,
		                                   .dp_shard = f->mesh->shard,
		                                   .elem_bytes = 4,
		                                   .accum = accum,
		                                   .cp = f->mesh->cp,
		                                   .ep = f->mesh->ep};
		step_plan_cost_init(cm, &m->cfg, o, &l, &naive);
		const struct model_cost_shape sh = step_plan_shape(o, &l);
		sched_cost_calibrate(cm, &m->cfg, &sh, stream, &f->mesh->shard_group,
		                     &f->mesh->world_group, o->overlap, false);
		step_plan_cost_link(cm, o);
		cm->overlap = o->overlap;
		/* one shard computed in place (fsdp.c): no collectives, no copies */
		cm->single =
		    f->mesh->shard == 1 && f->mesh->dp_replicate == 1 && !o->bf16 && !f->fp8_ag;
		if (f->mesh->tp > 1)
			sched_cost_calibrate_tp(cm, &f->mesh->tp_group, &f->mesh->world_group,
			                        o->tp_sim_gbps, o->tp_sim_latency_us);
		if (f->mesh->cp > 1) /* the cp group's transfers run on its own tp_coll */
			sched_cost_calibrate_cp(cm, &f->mesh->cp_group, &f->mesh->world_group,
			                        o->tp_sim_gbps, o->tp_sim_latency_us);
		if (f->mesh->ep > 1) /* the MoE layers' all-to-alls run on their own tp_coll */
			sched_cost_calibrate_ep(cm, &f->mesh->ep_group, &f->mesh->world_group,
			                        o->tp_sim_gbps, o->tp_sim_latency_us);
	}
	struct sched_auto_report rep;
	rc = step_plan_passes(&naive, o, *have_cm ? cm : NULL, &s, &rep);
	if (rep.n_evaluated > 0)
		step_plan_log_report(&rep, naive.n_units);
	sched_auto_report_free(&rep);
	if (rc == CT_OK)
		rc = fsdp_set_schedule(f, &s);
	if (rc == CT_OK) {
		char names[1024] = "", acl[96];
		size_t at = 0;
		for (int b = 0; b < s.n_buckets && at + 64 < sizeof(names); b++) {
			char one[256];
			sched_bucket_name(&s, b, one, sizeof(one));
			at += (size_t)snprintf(names + at, sizeof(names) - at, "%s%s", b ? "," : "",
			                       one);
		}
		LOG_INFO("schedule: %d nodes, %d buckets (%s), prefetch %d, reduce-scatter defer "
		         "%d, activation checkpointing %s",
		         s.n_nodes, s.n_buckets, names, o->reorder.prefetch, o->reorder.rs_defer,
		         sched_ac_label(o->ac, o->ac_every, acl, sizeof(acl)));
		if (*have_cm)
			step_plan_log(&s, cm);
	}
	sched_free(&naive);
	sched_free(&s);
	if (rc && *have_cm) {
		sched_cost_free(cm);
		*have_cm = false;
	}
	return rc;
}
