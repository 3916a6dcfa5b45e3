/* ctitan plan CONFIG [--section.key=value ...] --world-size N [--nodes]
 *
 * Builds the model's parameter table (no weights), the FSDP units for N ranks, the naive
 * schedule and the configured passes (activation checkpointing, buckets — "auto" uses this
 * cost model — and reordering), then predicts one step on the target described by the
 * config: metrics.peak_tflops (default: this CPU's theoretical peak for the compute dtype) x
 * plan.compute_efficiency for compute, comm.bandwidth_gbps and
 * comm.latency_us for collectives, plan.memory_bandwidth_gbs for copies; activations and
 * gathered parameters in plan.activation_dtype. Collectives are assumed to overlap compute
 * (accelerators run them on their own streams). Single process; no MPI. */
#include "cli/plan_cmd.h"
#include "cli/plan_pp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/config.h"
#include "kernels/fp8_linear.h"
#include "model/model_cost.h"
#include "parallel/cp.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"
#include "train/compute.h"
#include "train/model_spec.h"
#include "train/step_config.h"
#include "train/tp_check.h"
#include "train/trainer.h"

static void plan_usage(FILE *f)
{
	fprintf(f,
	        "usage: ctitan plan CONFIG.toml [--section.key=value ...] --world-size N "
	        "[--nodes]\n\n"
	        "Prints the training step's schedule after the passes and the predicted step "
	        "time,\nmemory per rank and exposed communication on N ranks, without running "
	        "it.\nThe target comes from the config: metrics.peak_tflops (default: this CPU's\n"
	        "theoretical peak for training.mixed_precision_param's compute dtype) x\n"
	        "plan.compute_efficiency, comm.bandwidth_gbps (required) and comm.latency_us,\n"
	        "plan.memory_bandwidth_gbs, plan.activation_dtype; the schedule from\n"
	        "comm.buckets, comm.prefetch, comm.reduce_scatter_defer, comm.memory_budget_gb,\n"
	        "activation_checkpoint.mode and parallelism.fsdp_reshard_after_forward.\n\n"
	        "With parallelism.pipeline_parallel_degree > 1 it simulates the pipeline schedule\n"
	        "(parallelism.pipeline_parallel_schedule) instead: bubble fraction, in-flight\n"
	        "activations per rank, step time and tokens/s per GPU for pp x tp x replicate x\n"
	        "shard x cp (tensor parallelism as a compute divisor only).\n\n"
	        "With parallelism.context_parallel_degree > 1 a rank holds seq_len / cp tokens;\n"
	        "its K/V transfers go over parallelism.tp_bandwidth_gbps; the attention kernel\n"
	        "runs at plan.attention_efficiency of the peak (0: plan.compute_efficiency).\n\n"
	        "  --world-size N  ranks (replicate x shard x context x tensor, times pipeline "
	        "with pp)\n"
	        "  --nodes         print every node of the step (default: micro-batch 0)\n");
}

static double gib(int64_t b)
{
	return (double)b / (double)(1ll << 30);
}

/* The step of the lowered schedule s with plain (async false) or async TP programs: every
 * unit pass's TP collectives as the family's model makes them (for Llama: per block and
 * micro-batch forward all-gathers the norm output before attention and the FFN and
 * reduce-scatters after wo and w2; backward gathers the output gradient and the norm output
 * again before each half, reduce-scatters the input gradient and gathers the norm weights'
 * partial gradients; recomputation repeats the forward's). */
struct plan_tp {
	struct sched_prediction p;
	int64_t n;     /* TP collectives per step */
	double comm_s; /* their time on the wire */
};

static void plan_tp_variant(const struct sched *s, const struct sched_cost_model *cm,
                            const struct model_config *mc, const struct model_cost_shape *sh,
                            bool async, struct plan_tp *o)
{
	struct sched v;
	sched_copy(&v, s);
	step_plan_unit_progs(v.units, v.n_units, mc, sh, async);
	sched_predict(&v, cm, &o->p, NULL);
	o->n = 0;
	o->comm_s = 0.0;
	for (int i = 0; i < v.n_nodes; i++) {
		const struct sched_node *n = &v.nodes[i];
		if (cm->inner && n->seg == 0 &&
		    (n->kind == SCHED_FWD || n->kind == SCHED_BWD || n->kind == SCHED_RECOMPUTE)) {
			/* a family's all-reduces inside the pass (Hyena's), on the tp group */
			enum model_pass mp = sched_node_pass(n);
			enum sched_work k = mp == MODEL_PASS_FWD   ? SCHED_WORK_FWD
			                    : mp == MODEL_PASS_BWD ? SCHED_WORK_BWD
			                                           : SCHED_WORK_REC;
			const struct model_prog *g = &cm->inner[n->unit * SCHED_WORK_COUNT + k];
			for (int j = 0; j < g->n; j++) {
				double c;
				if (g->c[j].role != MODEL_GROUP_TP)
					continue;
				sched_cost_tp_s(cm, k, &g->c[j], &c);
				o->n += c > 0;
				o->comm_s += c;
			}
		}
		if (n->kind != SCHED_TP_ALL_GATHER && n->kind != SCHED_TP_REDUCE_SCATTER)
			continue;
		double c;
		sched_cost_tp_s(cm, SCHED_WORK_FWD, &sched_node_prog(&v, n)->c[n->seg], &c);
		o->n += c > 0;
		o->comm_s += c;
	}
	sched_free(&v);
}

/* Bytes of memory traffic per element of one dynamic fp8 cast: read the operand for its amax,
 * read it again and write it as fp8 (torchao's tensorwise dynamic scaling; bf16 operands). */
#define PLAN_FP8_CAST_BYTES 5.0

/* float8 (model.converters = ["float8"]) on the target: with plan.fp8_peak_tflops, the
 * float8 linears' matmul FLOPs (their share of a block's linear FLOPs; rowwise_with_gw_hp
 * keeps the weight-gradient half of the backward in bf16) run at the fp8 peak instead of the
 * bf16 one, by scaling the blocks' matmul work; every operand of a float8 matmul is cast on
 * each use (M = B x T rows of a micro-batch): forward x and w; backward dy (once for both
 * gradients) and, for dx, w again and, for dw, x again (not with rowwise_with_gw_hp, whose
 * dw stays high precision); recompute as forward. The casts are elementwise memory traffic
 * (PLAN_FP8_CAST_BYTES per element at plan.memory_bandwidth_gbs), charged at any fp8 peak.
 * With the fp8 all-gather, each unit's wire bytes per shard element (1 for float8 weights).
 * Returns the per-unit array (or NULL); `note` gets a summary line. */
static double *plan_float8(const struct ct_config *c, const struct param_table *t, int64_t shard,
                           int64_t M, bool bf16, double peak, struct sched_cost_model *cm,
                           char *note, size_t len)
{
	enum fp8_recipe r = FP8_TENSORWISE;
	fp8_recipe_parse(c->float8.recipe_name, &r);
	fp8_linear_configure(true, r, c->float8.filter_fqns);
	double lin = 0, f8 = 0, cast_fwd = 0, cast_bwd = 0; /* elements cast per block */
	bool gw_hp = r == FP8_ROWWISE_GW_HP;
	for (int i = 0; i < t->count; i++)
		if (t->p[i].unit == 1 && t->p[i].ndim == 2) {
			const struct param_entry *e = &t->p[i];
			lin += (double)e->numel;
			if (!model_fp8_linear(e))
				continue;
			f8 += (double)e->numel;
			/* weight (out, in) as torch.nn.Linear: x is (M, in), dy (M, out) */
			double x = (double)M * (double)e->shape[1],
			       dy = (double)M * (double)e->shape[0];
			double w = (double)e->numel;
			cast_fwd += x + w;
			cast_bwd += dy + w + (gw_hp ? 0.0 : x);
		}
	for (int u = 1; u < cm->n_units - 1; u++) {
		cm->work[SCHED_WORK_FWD][SCHED_TERM_ELEM][u] += PLAN_FP8_CAST_BYTES * cast_fwd;
		cm->work[SCHED_WORK_REC][SCHED_TERM_ELEM][u] += PLAN_FP8_CAST_BYTES * cast_fwd;
		cm->work[SCHED_WORK_BWD][SCHED_TERM_ELEM][u] += PLAN_FP8_CAST_BYTES * cast_bwd;
	}
	double frac = lin > 0 ? f8 / lin : 0.0, fp8_peak = c->plan.fp8_peak_tflops * 1e12;
	if (fp8_peak > 0) {
		double k = peak / fp8_peak; /* an fp8 FLOP's time in bf16 FLOPs */
		double fwd = (1.0 - frac) + frac * k;
		double bwd = r == FP8_ROWWISE_GW_HP ? (1.0 - frac) + frac * (0.5 * k + 0.5) : fwd;
		for (int u = 1; u < cm->n_units - 1; u++) {
			cm->work[SCHED_WORK_FWD][SCHED_TERM_MATMUL][u] *= fwd;
			cm->work[SCHED_WORK_REC][SCHED_TERM_MATMUL][u] *= fwd;
			cm->work[SCHED_WORK_BWD][SCHED_TERM_MATMUL][u] *= bwd;
		}
	}
	double *esz = NULL;
	if (c->float8.enable_fsdp_float8_all_gather) {
		esz = xcalloc((size_t)t->n_units, sizeof(double));
		double *el = xcalloc((size_t)t->n_units, sizeof(double));
		for (int i = 0; i < t->count; i++) {
			const struct param_entry *e = &t->p[i];
			double chunk =
			    (double)((e->shape[0] + shard - 1) / shard * (e->numel / e->shape[0]));
			esz[e->unit] += chunk * (model_fp8_linear(e) ? 1.0 : bf16 ? 2.0 : 4.0);
			el[e->unit] += chunk;
		}
		for (int u = 0; u < t->n_units; u++)
			esz[u] = el[u] > 0 ? esz[u] / el[u] : 4.0;
		free(el);
		cm->ag_unit_esz = esz;
	}
	int n = snprintf(
	    note, len,
	    "float8 linears (%s): %.1f%% of a block's linear FLOPs in fp8, at %s; casts %.2f "
	    "GB forward, %.2f GB backward per block and micro-batch (%.0f B per element); "
	    "all-gather %s\n",
	    c->float8.recipe_name, 100.0 * frac,
	    fp8_peak > 0 ? "plan.fp8_peak_tflops" : "the bf16 rate (emulated: no fp8 peak given)",
	    PLAN_FP8_CAST_BYTES * cast_fwd / 1e9, PLAN_FP8_CAST_BYTES * cast_bwd / 1e9,
	    PLAN_FP8_CAST_BYTES, esz ? "fp8 for float8 weights" : "in the param dtype");
	if (n >= (int)len && len > 1) /* a long recipe name: the note is cut, still one line */
		note[len - 2] = '\n';
	fp8_linear_configure(false, r, "");
	return esz;
}

static int plan_run(const struct ct_config *cfg, int64_t world, bool all_nodes)
{
	const struct ct_config *c = cfg;
	int64_t tp = c->parallelism.tensor_parallel_degree;
	int64_t cp =
	    c->parallelism.context_parallel_degree > 1 ? c->parallelism.context_parallel_degree : 1;
	if (cp > 1) { /* what training checks (train/tp_check.c), but the world size */
		const struct model_family *cf = model_family_named(c->model.name);
		if (cf && !cf->cp) {
			LOG_ERROR("ctitan plan: parallelism.context_parallel_degree = %lld: not "
			          "supported for model.name = \"%s\" (%s)",
			          (long long)cp, c->model.name,
			          cf->no_cp_why ? cf->no_cp_why
			                        : "the family has no context-parallel form");
			return CT_ERR_USAGE;
		}
		enum cp_balancer b;
		int brc = cp_balancer_parse(c->parallelism.context_parallel_load_balancer, &b);
		if (brc)
			return brc;
		int64_t div = cp_seq_divisor((int)cp, b);
		if (c->training.seq_len % div) {
			LOG_ERROR("ctitan plan: training.seq_len = %lld is not divisible by %lld "
			          "(parallelism.context_parallel_degree = %lld, "
			          "context_parallel_load_balancer = %s)",
			          (long long)c->training.seq_len, (long long)div, (long long)cp,
			          c->parallelism.context_parallel_load_balancer);
			return CT_ERR_USAGE;
		}
	}
	const int64_t ep = c->parallelism.expert_parallel_degree > 1
	                       ? c->parallelism.expert_parallel_degree
	                       : 1;
	const struct model_family *ef = ep > 1 ? model_family_named(c->model.name) : NULL;
	if (ef && !ef->ep) {
		LOG_ERROR("ctitan plan: parallelism.expert_parallel_degree = %lld is not supported "
		          "with model.name = \"%s\": the family has no routed experts to split",
		          (long long)ep, c->model.name);
		return CT_ERR_USAGE;
	}
	if (ep > 1 && (tp > 1 || cp > 1)) {
		LOG_ERROR("ctitan plan: parallelism.expert_parallel_degree = %lld is not supported "
		          "with tensor or context parallelism (as in training)",
		          (long long)ep);
		return CT_ERR_USAGE;
	}
	if (ep > 1 && c->parallelism.pipeline_parallel_degree > 1) { /* training runs it */
		LOG_ERROR("ctitan plan: parallelism.expert_parallel_degree = %lld with "
		          "pipeline_parallel_degree > 1: not modelled yet (the pipeline plan prices "
		          "no all-to-all inside the stages; training runs this layout)",
		          (long long)ep);
		return CT_ERR_USAGE;
	}
	if (c->comm.bandwidth_gbps <= 0) {
		LOG_ERROR(
		    "ctitan plan needs the target's link: comm.bandwidth_gbps (e.g. "
		    "--metrics.peak_tflops=989 --comm.bandwidth_gbps=400 for H100s on 400 Gb/s "
		    "InfiniBand)");
		return CT_ERR_USAGE;
	}
	if (c->parallelism.pipeline_parallel_degree > 1)
		return plan_pp_run(c, world, all_nodes);
	int64_t rep = c->parallelism.data_parallel_replicate_degree;
	int64_t shard = c->parallelism.data_parallel_shard_degree;
	if (shard == -1)
		shard = world / (rep * cp * tp);
	if (rep * shard * cp * tp != world) {
		LOG_ERROR("--world-size %lld is not data_parallel_replicate_degree (%lld) x "
		          "data_parallel_shard_degree (%lld) x context_parallel_degree (%lld) x "
		          "tensor_parallel_degree (%lld)",
		          (long long)world, (long long)rep, (long long)shard, (long long)cp,
		          (long long)tp);
		return CT_ERR_USAGE;
	}
	if (ep_check_shard(ep, shard))
		return CT_ERR_USAGE;
	int64_t dpw = rep * shard; /* data-parallel ranks */
	int64_t Bm = c->training.local_batch_size, T = c->training.seq_len;
	int64_t global =
	    c->training.global_batch_size < 0 ? Bm * dpw : c->training.global_batch_size;
	if (global % (Bm * dpw)) {
		LOG_ERROR("training.global_batch_size %lld is not a multiple of local_batch_size x "
		          "data-parallel ranks = %lld",
		          (long long)global, (long long)(Bm * dpw));
		return CT_ERR_USAGE;
	}
	int accum = (int)(global / (Bm * dpw));
	struct model_config mc;
	int rc = model_spec_from_config(cfg, &mc);
	if (rc)
		return rc;
	const struct model_family *fam = model_family_of(mc.kind);
	if (!model_cost_of(&mc)) {
		LOG_ERROR("ctitan plan: model.name = \"%s\": not supported (the family has no "
		          "cost model)",
		          fam->name);
		return CT_ERR_USAGE;
	}
	if (fam->ep && compute_float8(c)) {
		/* plan_float8 prices every block as block 1 and a linear's FLOPs by its weights:
		 * a MoE block's routed experts (high precision, top-k of them active) are neither */
		LOG_ERROR("ctitan plan: model.converters = float8 with model.name = \"%s\": not "
		          "modelled (the plan prices float8 from the first block's weights as every "
		          "block's; the MoE blocks' routed experts stay high precision and only top-k "
		          "of them compute); training runs it",
		          fam->name);
		return CT_ERR_USAGE;
	}
	struct step_plan_opts o;
	rc = step_config_opts(cfg, &o);
	if (rc)
		return rc;
	bool bf16 = o.bf16;
	bool act16 = strcmp(c->plan.activation_dtype, "bfloat16") == 0 ||
	             (strcmp(c->plan.activation_dtype, "auto") == 0 && bf16);
	/* the cost model's shapes are one TP rank's: its heads, FFN hidden and vocabulary; one
	 * cp rank's T / cp tokens; FSDP shards over dp_shard x cp */
	const struct step_plan_layout lay = {.B = Bm,
	                                     .T = T,
	                                     .tp = tp,
	                                     .dp_shard = shard * cp,
	                                     .elem_bytes = act16 ? 2 : 4,
	                                     .accum = accum,
	                                     .cp = cp,
	                                     .ep = ep};
	const struct model_cost_shape sh = step_plan_shape(&o, &lay);
	enum model_ac ac = o.ac;
	char acl[96];
	struct param_table t;
	struct sched naive, s;
	rc = step_plan_naive_shapes(&mc, &o, &lay, &t, &naive);
	if (rc)
		return rc;
	struct sched_cost_model cm;
	step_plan_cost_init(&cm, &mc, &o, &lay, &naive);
	/* the target's peak for the run's compute dtype: metrics.peak_tflops, else this CPU's */
	char peak_why[256];
	double peak = compute_peak_flops(c, peak_why, sizeof(peak_why));
	cm.matmul_flops = cm.attn_flops = peak * c->plan.compute_efficiency;
	if (c->plan.attention_efficiency > 0)
		cm.attn_flops = peak * c->plan.attention_efficiency;
	cm.mem_bytes_s = c->plan.memory_bandwidth_gbs * 1e9;
	char f8note[256] = "";
	double *f8esz = compute_float8(c) ? plan_float8(c, &t, shard * cp, Bm * T / cp, bf16, peak,
	                                                &cm, f8note, sizeof(f8note))
	                                  : NULL;
	step_plan_cost_link(&cm, &o);
	cm.tp_latency_s = c->comm.latency_us * 1e-6;
	cm.tp_bytes_s = c->parallelism.tp_bandwidth_gbps * 1e9 / 8.0;
	/* the cp group's K/V transfers: on the intra-node link, as TP's */
	cm.cp_latency_s = cm.tp_latency_s;
	cm.cp_bytes_s = cm.tp_bytes_s;
	/* the ep group's all-to-alls: on the data-parallel link (ep ranks span nodes) */
	cm.ep_latency_s = c->comm.latency_us * 1e-6;
	cm.ep_bytes_s = c->comm.bandwidth_gbps * 1e9 / 8.0;
	cm.full_elem_bytes = act16 ? 2 : 4;
	cm.full_twin_bytes = 0; /* the target keeps gathered weights in one dtype */
	cm.overlap = true;
	/* the plans the automatic search compares, also when the config names a manual plan */
	struct sched_auto_report arep;
	struct sched as;
	bool is_auto = strcmp(o.buckets, "auto") == 0;
	struct step_plan_opts ao = o;
	ao.buckets = "auto";
	rc = step_plan_passes(&naive, &ao, &cm, &as, &arep);
	if (rc == CT_OK)
		sched_free(&as);
	if (rc == CT_OK)
		rc = step_plan_passes(&naive, is_auto ? &ao : &o, &cm, &s, NULL);
	if (rc) {
		sched_auto_report_free(&arep);
		goto out_sched;
	}
	struct sched_prediction p;
	sched_predict(&s, &cm, &p, NULL);
	double fpt = model_cost_flops_per_token(&mc, T);
	/* per rank: TP shares tokens, cp ranks hold T / cp each */
	double tokens = (double)(Bm * T * accum) / (double)(tp * cp);
	struct plan_tp tpv[2];                                 /* plain, async */
	if (tp > 1)
		for (int v = 0; v < 2; v++)
			plan_tp_variant(&s, &cm, &mc, &sh, v == 1, &tpv[v]);
	printf("model %s %s: %.3g parameters (%lld layers, dim %lld); batch %lld x seq %lld "
	       "x %d micro-batches per rank\n",
	       fam->name, model_config_flavor(&mc), (double)t.numel,
	       (long long)model_config_n_layers(&mc), (long long)model_config_dim(&mc),
	       (long long)Bm, (long long)T, accum);
	printf("mesh: %lld ranks = %lld replicas x %lld shards (FSDP, reshard %s) x %lld "
	       "context-parallel x %lld tensor-parallel; activation checkpointing %s\n",
	       (long long)world, (long long)rep, (long long)shard,
	       c->parallelism.fsdp_reshard_after_forward, (long long)cp, (long long)tp,
	       sched_ac_label(ac, o.ac_every, acl, sizeof(acl)));
	printf("target: %.3g TFLOP/s peak (%s) x %.2f efficiency (attention %.2f), %s matmuls, "
	       "link %.0f Gbit/s + %.0f us, memory %.0f GB/s; %s activations and gathers\n\n",
	       peak / 1e12, peak_why, c->plan.compute_efficiency, cm.attn_flops / peak,
	       bf16 ? "bf16" : "fp32", c->comm.bandwidth_gbps, c->comm.latency_us,
	       c->plan.memory_bandwidth_gbs, act16 ? "bf16" : "fp32");
	printf("schedule after passes (checkpoint %s -> buckets %s -> reorder prefetch %d, "
	       "reduce-scatter defer %d):\n",
	       acl, o.buckets, o.reorder.prefetch, o.reorder.rs_defer);
	sched_print(&s, stdout, !all_nodes);
	printf("\nplans compared (comm.buckets = \"auto\", prefetch 0..%d, reduce-scatter defer "
	       "0..%d, bucket cap %.0f MiB%s):\n",
	       o.reorder.prefetch, o.reorder.rs_defer, c->comm.bucket_cap_mb,
	       o.reorder.memory_bytes > 0 ? ", memory budget" : "");
	sched_auto_report_print(&arep, naive.n_units, stdout, "  ");
	if (!is_auto)
		printf("  (the configured plan '%s' is the one below)\n", o.buckets);
	sched_auto_report_free(&arep);
	printf("\nbucket sizes (gathered parameters):");
	for (int b = 0; b < s.n_buckets && b < 12; b++)
		printf(" %.0f MiB",
		       (double)sched_bucket_full(&s, b) * (double)cm.full_elem_bytes / 1048576.0);
	printf("%s\n\n", s.n_buckets > 12 ? " ..." : "");
	printf("predicted step time      %.3f s  (compute %.3f s, communication %.3f s in %lld "
	       "collectives)\n",
	       p.step_s, p.compute_s, p.comm_s, (long long)p.n_collectives);
	printf("exposed communication    %.3f s  (%.1f%% of the step)\n", p.exposed_s,
	       100.0 * p.exposed_s / p.step_s);
	if (tp > 1) {
		double plain = tpv[0].p.step_s, async = tpv[1].p.step_s;
		printf(
		    "tensor parallelism       %lld collectives per step (TP nodes of the "
		    "schedule, in-pass all-reduces) over %.0f Gbit/s (parallelism.tp_bandwidth_gbps), %.3f s; exposed "
		    "%.3f s plain, %.3f s async\n",
		    (long long)tpv[0].n, c->parallelism.tp_bandwidth_gbps, tpv[0].comm_s,
		    tpv[0].p.tp_s, tpv[1].p.tp_s);
		printf(
		    "throughput, plain TP     %.0f tokens/s per rank, MFU %.1f%%, step %.3f s%s\n",
		    tokens / plain, 100.0 * fpt * tokens / plain / peak, plain,
		    c->parallelism.enable_async_tensor_parallel ? "" : "  <- this config");
		if (fam->tp_whole_stream) /* no sequence parallelism: nothing to decompose */
			printf("throughput, async TP     (none: model.name = \"%s\" has no async TP, "
			       "its TP is not sequence-parallel)\n",
			       fam->name);
		else
			printf("throughput, async TP     %.0f tokens/s per rank, MFU %.1f%%, step "
			       "%.3f s%s\n",
			       tokens / async, 100.0 * fpt * tokens / async / peak, async,
			       c->parallelism.enable_async_tensor_parallel ? "  <- this config" : "");
		printf("  (model FLOPs %.3g per token)\n", fpt);
	} else {
		printf("throughput               %.0f tokens/s per rank, MFU %.1f%% (model FLOPs "
		       "%.3g per token)\n",
		       tokens / p.step_s, 100.0 * fpt * tokens / p.step_s / peak, fpt);
	}
	if (cp > 1)
		printf(
		    "context parallelism      %lld ranks, %lld tokens each (%s), K/V %s over %.0f "
		    "Gbit/s (parallelism.tp_bandwidth_gbps): %.1f MiB sent per step and rank, "
		    "%.3f s on the wire, %.3f s exposed (CP-* schedule nodes)\n",
		    (long long)cp, (long long)(T / cp),
		    sh.cp_headtail ? "head-tail balanced" : "contiguous",
		    sh.cp_ring ? "round a ring" : "all-gathered", c->parallelism.tp_bandwidth_gbps,
		    (double)p.cp_wire_bytes / 1048576.0, p.cp_comm_s, p.cp_s);
	if (ep > 1) {
		/* one MoE layer's forward all-to-alls: the counts in the pass, the dispatch and
		 * combine its program's nodes */
		int64_t layer = 0, n_layer = 0;
		for (int u = 0; u < cm.n_units && !n_layer; u++) {
			struct model_prog pr;
			model_cost_unit_prog(&mc, &sh, false, u, MODEL_PASS_FWD, &pr);
			const struct model_prog *gs[2] = {
			    &cm.inner[u * SCHED_WORK_COUNT + SCHED_WORK_FWD], &pr};
			for (int k = 0; k < 2; k++)
				for (int j = 0; j < gs[k]->n; j++)
					if (gs[k]->c[j].role == MODEL_GROUP_EP &&
					    gs[k]->c[j].kind == MODEL_COLL_ALL_TO_ALL)
						layer += gs[k]->c[j].bytes, n_layer++;
		}
		printf("expert parallelism       %lld ranks, balanced routing: %.2f MiB sent per "
		       "MoE layer and micro-batch forward in %lld all-to-alls (counts, dispatch "
		       "posted beside the shared expert, combine; backward 2 more of the rows, the "
		       "first posted); %lld per step, %.1f MiB sent, %.3f s on the wire, %.3f s "
		       "exposed (comm.bandwidth_gbps)\n",
		       (long long)ep, (double)layer / 1048576.0, (long long)n_layer,
		       (long long)p.n_ep, (double)p.ep_wire_bytes / 1048576.0, p.ep_comm_s, p.ep_s);
	}
	printf(
	    "all-gather bytes         %.1f MiB per step sent by each rank (%lld-byte elements%s)\n",
	    (double)p.ag_wire_bytes / 1048576.0, (long long)cm.ag_elem_bytes,
	    f8esz ? "; float8 weights 1 byte" : "");
	if (f8note[0])
		printf("%s", f8note);
	printf("memory per rank          %.2f GiB peak\n", gib(p.peak_bytes));
	printf("  parameters %.2f, gradients %.2f, optimizer %.2f (shards); activations %.2f;\n"
	       "  gathered parameters %.2f, unsharded gradients %.2f, comm buffers %.2f GiB\n",
	       gib(cm.params_bytes), gib(cm.grads_bytes), gib(cm.optim_bytes), gib(cm.act_bytes),
	       gib(p.full_params_bytes), gib(p.full_grads_bytes), gib(p.comm_bytes));
	printf("  activations of one micro-batch's model %lld bytes (saved, scratch, tokens)\n",
	       (long long)cm.act_bytes);
	sched_free(&s);
out_sched:
	free(f8esz);
	sched_cost_free(&cm);
	sched_free(&naive);
	param_table_free(&t);
	return rc;
}

int cmd_plan(int argc, char **argv)
{
	int64_t world = 0;
	bool all_nodes = false;
	char **rest = xcalloc((size_t)argc + 1, sizeof(char *));
	int nrest = 0, rc = CT_OK;
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			plan_usage(stdout);
			free(rest);
			return 0;
		}
		const char *v = NULL;
		if (strcmp(argv[i], "--world-size") == 0) {
			if (i + 1 >= argc) {
				fprintf(stderr, "ctitan plan: --world-size needs a value\n");
				free(rest);
				return 2;
			}
			v = argv[++i];
		} else if (strncmp(argv[i], "--world-size=", 13) == 0) {
			v = argv[i] + 13;
		} else if (strcmp(argv[i], "--nodes") == 0) {
			all_nodes = true;
			continue;
		} else {
			rest[nrest++] = argv[i];
			continue;
		}
		char *end;
		long long w = strtoll(v, &end, 10);
		if (*v == 0 || *end || w < 1 || w > 1 << 24) {
			fprintf(stderr, "ctitan plan: --world-size '%s': expected 1 .. %d\n", v,
			        1 << 24);
			free(rest);
			return 2;
		}
		world = w;
	}
	if (nrest < 1 || strncmp(rest[0], "--", 2) == 0 || world == 0) {
		fprintf(stderr, "ctitan plan: %s (see ctitan plan --help)\n",
		        world == 0 ? "missing --world-size N" : "missing CONFIG.toml");
		free(rest);
		return 2;
	}
	struct ct_config cfg;
	config_defaults(&cfg);
	rc = config_load_file(&cfg, rest[0]);
	if (!rc)
		rc = config_apply_args(&cfg, nrest - 1, rest + 1);
	if (!rc)
		rc = config_validate(&cfg);
	if (!rc)
		rc = plan_run(&cfg, world, all_nodes);
	free(rest);
	return ct_exit_code(rc);
}
