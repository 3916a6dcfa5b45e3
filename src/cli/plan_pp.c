/* `ctitan plan` with pipeline parallelism: every pipeline rank's step as the schedule nodes the
 * run executes (sched_build_pp), timed together by the cost model (sched_predict_pp) with each
 * stage's forward / backward from its units' terms, the stage-boundary transfers on the link,
 * and FSDP's per-step gathers and reduce-scatters inside each stage.
 *
 * Assumptions (printed with the plan):
 *  - compute: each unit's FLOPs (the cost model's, per micro-batch) over metrics.peak_tflops x
 *    plan.compute_efficiency, divided by tensor_parallel_degree; tensor-parallel collectives
 *    are taken as hidden (async TP on an intra-node link; TP itself is not implemented yet,
 *    only planned);
 *  - backward = the cost model's backward FLOPs + its recompute under activation checkpointing;
 *  - a stage-boundary transfer moves micro_rows x seq_len x dim activations (in
 *    plan.activation_dtype, split over tp by sequence parallelism) at comm.bandwidth_gbps +
 *    comm.latency_us;
 *  - FSDP under PP gathers each stage's parameters once per step and reduce-scatters once
 *    (reshard never), blocking on the compute thread as parallel/pp does; HSDP's replica
 *    all-reduce is exposed; AdamW runs at plan.memory_bandwidth_gbs;
 *  - memory: shards (fp32 master, gradients, two moments), the stage's gathered parameters
 *    and gradients, and the schedule's peak in-flight micro-batches of activations. */
#include "cli/plan_pp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/model_cost.h"
#include "parallel/pp.h"
#include "parallel/step_plan.h"
#include "schedule/pp_schedule.h"
#include "schedule/sched_cost.h"
#include "train/compute.h"
#include "train/model_spec.h"
#include "train/step_config.h"

static double gib(double b)
{
	return b / (double)(1ll << 30);
}

int plan_pp_run(const struct ct_config *c, int64_t world, bool all_nodes)
{
	int64_t pp = c->parallelism.pipeline_parallel_degree;
	int64_t tp = c->parallelism.tensor_parallel_degree;
	int64_t rep = c->parallelism.data_parallel_replicate_degree;
	int64_t shard = c->parallelism.data_parallel_shard_degree;
	/* context parallelism: cp ranks share each sequence; the stages shard over shard x cp */
	int64_t cp =
	    c->parallelism.context_parallel_degree > 1 ? c->parallelism.context_parallel_degree : 1;
	if (world % (pp * tp * rep * cp)) {
		LOG_ERROR(
		    "--world-size %lld is not a multiple of pipeline (%lld) x tensor (%lld) x "
		    "replicate (%lld) x context (%lld)",
		    (long long)world, (long long)pp, (long long)tp, (long long)rep, (long long)cp);
		return CT_ERR_USAGE;
	}
	if (shard == -1)
		shard = world / (pp * tp * rep * cp);
	if (pp * tp * rep * shard * cp != world) {
		LOG_ERROR(
		    "--world-size %lld is not pipeline x tensor x replicate x shard x context = "
		    "%lld",
		    (long long)world, (long long)(pp * tp * rep * shard * cp));
		return CT_ERR_USAGE;
	}
	int64_t dp = rep * shard, Bm = c->training.local_batch_size, T = c->training.seq_len;
	int64_t global = c->training.global_batch_size < 0 ? Bm * dp : c->training.global_batch_size;
	if (global % (Bm * dp)) {
		LOG_ERROR("training.global_batch_size %lld is not a multiple of local_batch_size x "
		          "data-parallel degree = %lld",
		          (long long)global, (long long)(Bm * dp));
		return CT_ERR_USAGE;
	}
	int64_t mbs = c->parallelism.pipeline_parallel_microbatch_size;
	int64_t rows = global / dp;
	if (rows % mbs) {
		LOG_ERROR("parallelism.pipeline_parallel_microbatch_size: %lld does not divide the %lld "
		          "sequences per step and data-parallel rank",
		          (long long)mbs, (long long)rows);
		return CT_ERR_USAGE;
	}
	int m = (int)(rows / mbs);
	struct model_config mc;
	int rc = model_spec_from_config(c, &mc);
	if (rc)
		return rc;
	const struct model_family *fam = model_family_of(mc.kind);
	if (!model_cost_of(&mc)) {
		LOG_ERROR("ctitan plan: model.name = \"%s\": not supported (the family has no "
		          "cost model)",
		          fam->name);
		return CT_ERR_USAGE;
	}
	int64_t n_layers = model_config_n_layers(&mc);
	struct step_plan_opts so;
	rc = step_config_opts(c, &so);
	if (rc)
		return rc;
	enum model_ac ac = so.ac;
	char acl[96];
	enum pp_style style = PP_1F1B;
	struct pp_sched s;
	int v = 1;
	int64_t fl = c->parallelism.pipeline_parallel_first_stage_less_layers;
	int64_t ll = c->parallelism.pipeline_parallel_last_stage_less_layers;
	if (c->parallelism.pipeline_parallel_schedule_csv[0]) {
		rc = pp_sched_read_csv(&s, c->parallelism.pipeline_parallel_schedule_csv, (int)pp, m);
	} else {
		rc = pp_style_parse(c->parallelism.pipeline_parallel_schedule, &style);
		if (!rc)
			rc = pp_stages_per_rank(n_layers, (int)pp, style,
			                        c->parallelism.pipeline_parallel_layers_per_stage, fl,
			                        ll, &v);
		if (!rc)
			rc = pp_sched_generate(&s, style, (int)pp, v, m);
	}
	if (rc)
		return rc;
	int S = s.n_stages;
	v = s.v;
	int *u0 = xcalloc((size_t)S + 1, sizeof(int));
	struct param_table t;
	model_table_build(&t, &mc);
	struct sched_unit *units = xcalloc((size_t)t.n_units, sizeof(*units));
	struct sched naive = {0};
	struct sched_cost_model cm = {0};
	struct pp_sim sim = {0};
	struct sched *ranks = xcalloc((size_t)pp, sizeof(*ranks));
	struct param_table tt; /* a TP rank's slice: what its stages gather and reduce */
	memset(&tt, 0, sizeof(tt));
	rc = pp_split_stages(n_layers, S, fl, ll, u0);
	if (!rc)
		rc = model_table_build_tp(&tt, &mc, (int)tp, 0);
	if (rc)
		goto out;
	sched_units_from_table(&tt, shard * cp, units);
	sched_build(&naive, units, t.n_units, 1, SCHED_RESHARD_NEVER);
	bool bf16 = compute_bf16(c);
	char peak_why[256];
	double peak_flops = compute_peak_flops(c, peak_why, sizeof(peak_why));
	bool act16 = strcmp(c->plan.activation_dtype, "bfloat16") == 0 ||
	             (strcmp(c->plan.activation_dtype, "auto") == 0 && bf16);
	int64_t eb = act16 ? 2 : 4;
	/* the whole model's work per stage (tp divides it below) */
	const struct model_cost_shape sh = {.B = mbs,
	                                    .T = T,
	                                    .ac = ac,
	                                    .ac_every = so.ac_every,
	                                    .tp = 1,
	                                    .elem_bytes = eb,
	                                    .cp = cp,
	                                    .cp_ring = so.cp_ring,
	                                    .cp_headtail = so.cp_headtail};
	/* the programs' K/V transfers, which the stages run inside their passes */
	step_plan_unit_progs(units, t.n_units, &mc, &sh, false);
	sched_cost_init(&cm, &mc, &sh, &naive, shard * cp, bf16);
	double rate = peak_flops * c->plan.compute_efficiency * (double)tp;
	double bw = c->comm.bandwidth_gbps * 1e9 / 8.0, lat = c->comm.latency_us * 1e-6;
	/* stage times from the cost model's per-node-kind terms: FLOPs at the target's peak x
	 * efficiency (x tp: a TP group shares a stage's work), bytes at its memory bandwidth */
	cm.matmul_flops = cm.attn_flops = rate;
	if (c->plan.attention_efficiency > 0)
		cm.attn_flops = peak_flops * c->plan.attention_efficiency * (double)tp;
	cm.mem_bytes_s = c->plan.memory_bandwidth_gbs * 1e9 * (double)tp;
	cm.ag_latency_s = cm.rs_latency_s = lat;
	/* the K/V transfers inside the stages: the intra-node link, as TP's */
	cm.cp_latency_s = lat;
	cm.cp_bytes_s = c->parallelism.tp_bandwidth_gbps * 1e9 / 8.0;
	cm.ag_bytes_s = cm.rs_bytes_s = bw;
	cm.overlap = false;
	double tf_max = 0, tb_max = 0;
	for (int r = 0; r < (int)pp; r++)
		sched_build_pp(&ranks[r], &s, r, units, t.n_units, u0);
	for (int st = 0; st < S; st++) { /* the slowest stage's F and B, for the summary line */
		struct sched_node f = {.kind = SCHED_PP_F, .stage = st},
		                  b = {.kind = SCHED_PP_B, .stage = st};
		const struct sched *rs = &ranks[st % pp];
		tf_max = fmax(tf_max, sched_cost_pp_node_s(rs, &cm, &f));
		tb_max = fmax(tb_max, sched_cost_pp_node_s(rs, &cm, &b));
	}
	double xfer_bytes = (double)(mbs * T / cp * model_config_dim(&mc) * eb) / (double)tp;
	double xfer = lat + xfer_bytes / bw;
	char why[256];
	if (!pp_sched_check(&s, &sim, why, sizeof(why))) { /* in-flight micro-batches */
		LOG_ERROR("ctitan plan: the pipeline schedule does not run: %s", why);
		rc = CT_ERR_USAGE;
		goto out;
	}
	/* the step: every rank's schedule nodes, as the run executes them */
	struct sched_pp_link link = {.latency_s = lat, .bytes_s = bw, .bytes = (int64_t)xfer_bytes};
	struct sched_pp_prediction pred;
	sched_predict_pp(ranks, &cm, &link, &pred);
	/* FSDP inside the stage (rank 0's virtual stages; every rank's are about the same) */
	double ar = 0, stage_params = 0, act_stage = 0;
	int64_t act_model = model_cost_activation_bytes(&mc, &sh);
	for (int ch = 0; ch < v; ch++) {
		int st = ch * (int)pp;
		for (int u = u0[st]; u < u0[st + 1]; u++)
			stage_params += (double)units[u].full_numel; /* the TP slice */
		int blocks = 0;
		for (int u = u0[st]; u < u0[st + 1]; u++)
			blocks += units[u].is_block;
		act_stage += (double)act_model * blocks / (double)n_layers / (double)tp;
	}
	if (rep > 1)
		ar = lat + 2.0 * stage_params / (double)(shard * cp) * 4.0 * (double)(rep - 1) /
		               (double)rep / bw;
	double step = pred.step_s + ar;
	double tokens = (double)(global * T);
	double tps_gpu = tokens / step / (double)world;
	double fpt = model_cost_flops_per_token(&mc, T);
	double peak = peak_flops;
	double theory = pp_bubble_theory(style, (int)pp, v, m);
	int inflight0 = sim.peak_inflight[0];
	double shard_p = stage_params / (double)(shard * cp);
	double mem_shards = shard_p * 4.0 * 4.0; /* master, gradient, two moments */
	double mem_full = stage_params * (bf16 ? 2.0 : 4.0) * 2.0; /* gathered params + grads */
	double mem_act = act_stage / (double)v * (double)inflight0;

	printf("model %s %s: %.3g parameters (%lld layers, dim %lld); %lld sequences of %lld "
	       "per step\n",
	       fam->name, model_config_flavor(&mc), (double)t.numel, (long long)n_layers,
	       (long long)model_config_dim(&mc), (long long)global, (long long)T);
	printf("mesh: %lld ranks = %lld pipeline x %lld tensor x %lld replicas x %lld shards "
	       "x %lld context-parallel (FSDP inside each stage over shards x cp); activation "
	       "checkpointing %s\n",
	       (long long)world, (long long)pp, (long long)tp, (long long)rep, (long long)shard,
	       (long long)cp, sched_ac_label(ac, so.ac_every, acl, sizeof(acl)));
	printf("pipeline: %s, %d stages (%d per rank), %d micro-batches of %lld x %lld tokens%s\n",
	       pp_style_name(s.style), S, v, m, (long long)mbs, (long long)(T / cp),
	       cp > 1 ? " (a cp rank's share of each sequence)" : "");
	printf("target: %.4g TFLOP/s peak (%s) x %.2f efficiency per GPU, link %.0f Gbit/s + "
	       "%.0f us; %s activations\n",
	       peak_flops / 1e12, peak_why, c->plan.compute_efficiency, c->comm.bandwidth_gbps,
	       c->comm.latency_us, act16 ? "bf16" : "fp32");
	printf("assumptions: tensor-parallel compute divided by %lld with its collectives hidden "
	       "(async TP); FSDP gathers and reduce-scatters once per step under PP, blocking, as "
	       "the run does; AdamW at the memory bandwidth\n\n",
	       (long long)tp);
	if (all_nodes) {
		pp_sched_print(&s, stdout);
	} else {
		char buf[32];
		printf("rank 0's actions:");
		for (int i = 0; i < s.n[0] && i < 40; i++) {
			pp_action_str(&s.a[0][i], buf, sizeof(buf));
			printf(" %s", buf);
		}
		printf("%s\n", s.n[0] > 40 ? " ..." : "");
	}
	printf("per stage and micro-batch: forward %.1f ms, backward %.1f ms (slowest stage); "
	       "transfer %.2f ms\n\n",
	       tf_max * 1e3, tb_max * 1e3, xfer * 1e3);
	printf("bubble fraction          %.3f  (every rank's schedule nodes timed together; unit-time "
	       "theory %.3f)\n",
	       pred.bubble, theory);
	printf("in-flight activations    %d micro-batches on rank 0 = %.2f GiB (rank:",
	       inflight0, gib(mem_act));
	for (int r = 0; r < s.p && r < 16; r++)
		printf(" %d", sim.peak_inflight[r]);
	printf(")\n");
	printf("predicted step time      %.3f s  (pipeline %.3f s, FSDP gathers and reduce-scatters "
	       "%.3f s, HSDP all-reduce %.3f s)\n",
	       step, pred.pipeline_s, pred.fsdp_s, ar);
	printf("throughput               %.0f tokens/s per GPU, MFU %.1f%% (model FLOPs %.3g per "
	       "token)\n",
	       tps_gpu, 100.0 * fpt * tps_gpu / peak, fpt);
	printf("memory per rank          %.2f GiB: shards %.2f, gathered parameters and gradients "
	       "%.2f, activations %.2f\n",
	       gib(mem_shards + mem_full + mem_act), gib(mem_shards), gib(mem_full), gib(mem_act));
out:
	pp_sim_free(&sim);
	if (cm.work[0][0])
		sched_cost_free(&cm);
	sched_free(&naive);
	for (int r = 0; r < (int)pp; r++)
		sched_free(&ranks[r]);
	free(ranks), free(units), free(u0);
	param_table_free(&t);
	param_table_free(&tt);
	pp_sched_free(&s);
	return rc;
}
