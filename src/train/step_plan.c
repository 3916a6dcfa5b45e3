/* train/step_plan: config → schedule pipeline (+ cost model) → fsdp. */
#include "train/step_plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "schedule/sched_trace.h"
#include "train/compute.h"

int step_plan_ac(const struct ct_config *cfg, enum model_ac *ac)
{
	return sched_ac_parse(cfg->activation_checkpoint.mode, ac);
}

int step_plan_check_buckets(const struct ct_config *cfg, int n_units)
{
	if (strcmp(cfg->comm.buckets, "auto") == 0)
		return CT_OK;
	struct sched_bucket *plan;
	int nb;
	char why[256];
	if (sched_bucket_plan_parse(cfg->comm.buckets, n_units, &plan, &nb, why, sizeof(why))) {
		LOG_ERROR("comm.buckets: '%s': %s", cfg->comm.buckets, why);
		return CT_ERR_USAGE;
	}
	free(plan);
	return CT_OK;
}

void step_plan_reorder_opts(const struct ct_config *cfg, struct sched_reorder_opts *o)
{
	o->prefetch = (int)cfg->comm.prefetch;
	o->rs_defer = (int)cfg->comm.reduce_scatter_defer;
	o->memory_bytes = (int64_t)(cfg->comm.memory_budget_gb * (double)(1ll << 30));
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
		    cm->rs_bytes_s / 1e9, p.comm_cpu_s, 100.0 * (cm->overlap ? cm->interference : 0.0),
		    p.comm_cpu_paid_s);
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

int step_plan_setup(struct fsdp *f, const struct ct_config *cfg, int accum,
                    struct comm_stream *stream, struct sched_cost_model *cm, bool *have_cm)
{
	enum model_ac ac;
	int rc = step_plan_ac(cfg, &ac);
	if (rc)
		return rc;
	struct sched_reorder_opts o;
	step_plan_reorder_opts(cfg, &o);
	struct sched naive, s;
	fsdp_naive_schedule(f, accum, &naive);
	/* profiling compares the step with the cost model where the family has one */
	*have_cm = strcmp(cfg->comm.buckets, "auto") == 0 || o.memory_bytes > 0 ||
	           (cfg->profiling.enable_profiling && model_family_of(f->model->cfg.kind)->cost_model);
	if (*have_cm && !model_family_of(f->model->cfg.kind)->cost_model) {
		LOG_ERROR("comm.buckets = \"auto\", comm.memory budget and profiling need the cost "
		          "model, which does not yet support model.name = \"%s\"",
		          model_kind_name(f->model->cfg.kind));
		sched_free(&naive);
		return CT_ERR_USAGE;
	}
	if (*have_cm) {
		struct model *m = f->model;
		bool bf16 = compute_bf16(cfg);
		/* a TP rank computes its slice of the shapes (sequence-parallel norms: 1/tp) */
		int64_t tp = f->mesh->tp;
		struct llama_config lc = llama_config_tp_slice(llama_cfg(&m->cfg), tp);
		sched_cost_init(cm, &lc, m->B, m->T, &naive, f->mesh->dp_shard, bf16, ac, 4);
		if (tp > 1)
			cm->act_bytes =
			    sched_cost_activation_bytes(llama_cfg(&m->cfg), m->B, m->T, ac, 4) / tp;
		bool overlap = strcmp(cfg->comm.progress, "thread") == 0;
		sched_cost_calibrate(cm, &lc, m->B, m->T, stream, &f->mesh->dp_shard_group,
		                     &f->mesh->world_group, overlap);
		if (cfg->comm.bandwidth_gbps > 0) {
			cm->ag_bytes_s = cm->rs_bytes_s = cfg->comm.bandwidth_gbps * 1e9 / 8;
			cm->ag_latency_s = cm->rs_latency_s = cfg->comm.latency_us * 1e-6;
		}
		cm->overlap = overlap;
		/* one shard computed in place (fsdp.c): no collectives, no copies */
		cm->single = f->mesh->dp_shard == 1 && f->mesh->dp_replicate == 1 && !bf16 &&
		             !f->fp8_ag;
		if (f->mesh->tp > 1)
			sched_cost_calibrate_tp(cm, &f->mesh->tp_group, &f->mesh->world_group,
			                        cfg->comm.simulate_bandwidth_gbps,
			                        cfg->comm.simulate_latency_us);
	}
	struct sched_auto_report rep;
	rc = sched_pipeline(&naive, ac, cfg->comm.buckets,
	                    (int64_t)(cfg->comm.bucket_cap_mb * (double)(1 << 20)), &o,
	                    *have_cm ? cm : NULL, &s, &rep);
	if (rep.n_evaluated > 0)
		step_plan_log_report(&rep, naive.n_units);
	sched_auto_report_free(&rep);
	if (rc == CT_OK)
		rc = fsdp_set_schedule(f, &s);
	if (rc == CT_OK) {
		char names[1024] = "";
		size_t at = 0;
		for (int b = 0; b < s.n_buckets && at + 64 < sizeof(names); b++) {
			char one[256];
			sched_bucket_name(&s, b, one, sizeof(one));
			at += (size_t)snprintf(names + at, sizeof(names) - at, "%s%s", b ? "," : "",
			                       one);
		}
		LOG_INFO("schedule: %d nodes, %d buckets (%s), prefetch %d, reduce-scatter defer "
		         "%d, activation checkpointing %s",
		         s.n_nodes, s.n_buckets, names, o.prefetch, o.rs_defer, sched_ac_name(ac));
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
