/* The automatic plan is optimal for its cost model (one process, no timing: fixed rates):
 *  - on several models (debug: every partition is searched; 125M and 1B: the dynamic
 *    program + local search) and links (slow with a high latency, where merging buckets pays;
 *    fast with no latency, where it does not; no overlap at all), auto's predicted step is <=
 *    the predicted step of every manual plan — per-block, every uniform grouping (k units per
 *    bucket, embedding and norm alone or joined) and random partitions — at every prefetch
 *    depth and reduce-scatter deferral the search may choose;
 *  - with a memory budget between the smallest and largest peaks, auto fits it and beats
 *    every manual plan that fits; with a budget no plan fits, auto and manual plans fail with
 *    CT_ERR_USAGE and the report holds the smallest peak of all plans.
 *   test_sched_auto */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/model.h"
#include "model/llama/llama.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"
#include "testutil.h"

#define NRANDOM 25

struct setup {
	const char *flavor;
	int64_t B, T, dp;
	enum model_ac ac;
	double flops, lat_s, bytes_s;
	bool overlap;
	const char *what;
	enum sched_reshard reshard;
	double cpu_bytes_s; /* > 0: the comm thread spends CPU per wire byte at this rate, all of
	                       it taken from compute (a core shared with compute) */
};

static void build(const struct setup *x, struct sched *naive, struct sched_cost_model *cm)
{
	struct llama_config c;
	CHECK(llama_config_preset(&c, x->flavor) == CT_OK, "preset");
	llama_config_finish(&c);
	struct param_table t;
	llama_table_build(&t, &c);
	struct sched_unit *u = calloc((size_t)t.n_units, sizeof(*u));
	sched_units_from_table(&t, x->dp, u);
	sched_build(naive, u, t.n_units, 1, x->reshard);
	struct model_config mc;
	*llama_cfg_init(&mc) = c;
	const struct model_cost_shape sh = {
	    .B = x->B, .T = x->T, .ac = x->ac, .tp = 1, .elem_bytes = 4};
	sched_cost_init(cm, &mc, &sh, naive, x->dp, false);
	cm->matmul_flops = x->flops;
	cm->attn_flops = x->flops / 3;
	cm->mem_bytes_s = 2e10;
	cm->ag_latency_s = cm->rs_latency_s = x->lat_s;
	cm->ag_bytes_s = cm->rs_bytes_s = x->bytes_s;
	cm->overlap = x->overlap;
	if (x->cpu_bytes_s > 0) {
		cm->ag_cpu_bytes_s = cm->rs_cpu_bytes_s = x->cpu_bytes_s;
		cm->ag_cpu_latency_s = cm->rs_cpu_latency_s = 2e-5;
		cm->interference = 1.0;
	}
	free(u);
	param_table_free(&t);
}

/* Predicted step and peak of a manual plan at depths (p, d); false if it fails the budget. */
static bool manual(const struct sched *naive, const struct setup *x,
                   const struct sched_cost_model *cm, const char *spec, int p, int d,
                   int64_t budget, double *step, int64_t *peak)
{
	struct sched_reorder_opts o = {p, d, budget};
	struct sched s;
	log_set_level(LOG_LEVEL_COUNT); /* a plan over the budget logs why; expected here */
	int rc = sched_pipeline(naive, x->ac, 0, spec, INT64_MAX / 4, &o, cm, &s, NULL);
	log_set_level(LOG_INFO);
	if (rc)
		return false;
	struct sched_prediction pr;
	sched_predict(&s, cm, &pr, NULL);
	*step = pr.step_s;
	*peak = pr.peak_bytes;
	sched_free(&s);
	return true;
}

/* The manual plans: uniform groupings and random partitions, as comm.buckets strings. */
static int manual_plans(int U, char ***out)
{
	char **v = calloc(4 * (size_t)U + NRANDOM + 1, sizeof(char *));
	int n = 0;
	struct sched_bucket *b = calloc((size_t)U, sizeof(*b));
	bool *cut = calloc((size_t)U, sizeof(bool));
	for (int k = 1; k <= U; k++)
		for (int var = 0; var < 4; var++) {
			int lo = var & 1 ? 1 : 0, hi = var & 2 ? U - 1 : U;
			memset(cut, 0, (size_t)U);
			cut[0] = true;
			for (int u = lo; u < hi; u += k)
				cut[u] = true;
			if (hi < U)
				cut[U - 1] = true;
			int nb = 0;
			for (int u = 0; u < U; u++) {
				if (cut[u])
					b[nb++] = (struct sched_bucket){u, 0};
				b[nb - 1].n_units++;
			}
			v[n] = malloc(8192);
			sched_plan_string(b, nb, U, v[n], 8192);
			n++;
		}
	for (int r = 0; r < NRANDOM; r++) {
		double pc = test_uniform(0.1, 0.9);
		int nb = 0;
		for (int u = 0; u < U; u++) {
			if (u == 0 || test_uniform(0, 1) < pc)
				b[nb++] = (struct sched_bucket){u, 0};
			b[nb - 1].n_units++;
		}
		v[n] = malloc(8192);
		sched_plan_string(b, nb, U, v[n], 8192);
		n++;
	}
	free(b), free(cut);
	*out = v;
	return n;
}

/* Auto vs every manual plan on one set-up; returns auto's bucket count and, in *gain, how
 * much faster than per-block (at the deepest depths) auto's plan predicts. */
static int check_setup(const struct setup *x, int P, int D, int64_t budget, bool expect_fit,
                       double *gain)
{
	struct sched naive, s;
	struct sched_cost_model cm;
	build(x, &naive, &cm);
	int U = naive.n_units;
	struct sched_reorder_opts o = {P, D, budget};
	struct sched_auto_report rep;
	log_set_level(LOG_LEVEL_COUNT);
	int rc = sched_pipeline(&naive, x->ac, 0, "auto", INT64_MAX / 4, &o, &cm, &s, &rep);
	log_set_level(LOG_INFO);
	double astep = INFINITY;
	int64_t apeak = 0;
	int nb = 0;
	if (rc == CT_OK) {
		struct sched_prediction pr;
		sched_predict(&s, &cm, &pr, NULL);
		astep = pr.step_s;
		apeak = pr.peak_bytes;
		nb = s.n_buckets;
		char why[256];
		EXPECT(sched_validate(&s, why, sizeof(why)), "%s: auto schedule invalid: %s",
		       x->what, why);
		EXPECT(fabs(astep - rep.top[0].step_s) <= 1e-12 * astep,
		       "%s: the schedule's step %.9f is not the report's best %.9f", x->what, astep,
		       rep.top[0].step_s);
		sched_free(&s);
	}
	EXPECT((rc == CT_OK) == expect_fit, "%s: auto returned %d", x->what, rc);
	char **plans;
	int n = manual_plans(U, &plans);
	int64_t min_peak = INT64_MAX;
	int beaten = 0, fitting = 0;
	double best_manual = INFINITY;
	char best_spec[160] = "";
	for (int i = 0; i < n; i++)
		for (int p = 0; p <= P; p++)
			for (int d = 0; d <= D; d++) {
				double st;
				int64_t pk;
				bool ok = manual(&naive, x, &cm, plans[i], p, d, budget, &st, &pk);
				/* the peak without a budget, for the smallest-peak check */
				if (!ok) {
					bool any =
					    manual(&naive, x, &cm, plans[i], p, d, 0, &st, &pk);
					CHECK(any, "plan without a budget");
					min_peak = pk < min_peak ? pk : min_peak;
					continue;
				}
				min_peak = pk < min_peak ? pk : min_peak;
				fitting++;
				EXPECT(rc || st >= rep.lower_bound_s * (1 - 1e-12),
				       "%s: '%s' predicts %.6f s, under the lower bound %.6f s",
				       x->what, plans[i], st, rep.lower_bound_s);
				if (st < best_manual) {
					best_manual = st;
					snprintf(best_spec, sizeof(best_spec), "%.120s p%d d%d",
					         plans[i], p, d);
				}
				if (st < astep * (1 - 1e-9)) { /* the search breaks ties by peak */
					beaten++;
					if (beaten <= 3)
						fprintf(
						    stderr,
						    "  FAIL %s: manual '%.100s' p%d d%d predicts "
						    "%.6f s < auto %.6f s\n",
						    x->what, plans[i], p, d, st, astep);
				}
			}
	if (gain) {
		double pb;
		int64_t pk;
		CHECK(manual(&naive, x, &cm, "per_block", P, D, budget, &pb, &pk), "per_block");
		*gain = pb / astep - 1.0;
	}
	EXPECT(beaten == 0, "%s: %d manual plans predicted faster than auto", x->what, beaten);
	if (rc == CT_OK)
		EXPECT(budget <= 0 || apeak <= budget, "%s: auto peak %lld over budget %lld",
		       x->what, (long long)apeak, (long long)budget);
	else
		EXPECT(rep.min_peak <= min_peak && rep.min_peak > budget,
		       "%s: reported smallest peak %lld, manual plans reach %lld (budget %lld)",
		       x->what, (long long)rep.min_peak, (long long)min_peak, (long long)budget);
	EXPECT(expect_fit || fitting == 0, "%s: %d manual plans fit where auto found none", x->what,
	       fitting);
	fprintf(stderr,
	        "  %-44s auto %.4f s (%2d of %2d buckets, %s, %lld plans) best manual %.4f s "
	        "(%s)\n",
	        x->what, astep, nb, U, rep.exhaustive ? "exhaustive" : "DP+local",
	        (long long)rep.n_evaluated, best_manual, best_spec);
	for (int i = 0; i < n; i++)
		free(plans[i]);
	free(plans);
	sched_auto_report_free(&rep);
	sched_cost_free(&cm);
	sched_free(&naive);
	return nb;
}

static const struct setup setups[] = {
    {"debugmodel", 2, 256, 4, MODEL_AC_NONE, 5e10, 5e-3, 1e9, true,
     "debug, slow link + 5 ms latency", SCHED_RESHARD_DEFAULT, 0},
    {"debugmodel", 2, 256, 4, MODEL_AC_SELECTIVE, 5e10, 0, 2e8, true,
     "debug, selective AC, 1.6 Gb/s no latency", SCHED_RESHARD_DEFAULT, 0},
    {"125M", 2, 256, 2, MODEL_AC_NONE, 2e11, 2e-3, 1.25e9, true,
     "125M, 10 Gb/s + 2 ms (merging pays)", SCHED_RESHARD_DEFAULT, 0},
    {"125M", 2, 256, 2, MODEL_AC_NONE, 2e11, 0, 1e11, true,
     "125M, 800 Gb/s, no latency, no reshard (it does not)", SCHED_RESHARD_NEVER, 0},
    {"125M", 2, 256, 2, MODEL_AC_FULL, 2e11, 0, 1e11, true, "125M, full AC, 800 Gb/s",
     SCHED_RESHARD_DEFAULT, 0},
    {"125M", 2, 256, 4, MODEL_AC_NONE, 2e11, 1e-3, 1e9, false, "125M, no overlap, 1 ms",
     SCHED_RESHARD_DEFAULT, 0},
    {"1B", 1, 1024, 8, MODEL_AC_SELECTIVE, 1e12, 5e-4, 5e9, true, "1B, 40 Gb/s + 0.5 ms",
     SCHED_RESHARD_DEFAULT, 0},
    {"125M", 2, 256, 2, MODEL_AC_FFN, 2e11, 5e-5, 4e9, true,
     "125M, shared memory, comm thread on compute's core", SCHED_RESHARD_DEFAULT, 4e9},
};

TEST_CASE(test_auto_beats_every_manual_plan)
{
	for (size_t i = 0; i < sizeof(setups) / sizeof(setups[0]); i++) {
		double gain;
		int nb = check_setup(&setups[i], 1, 1, 0, true, &gain);
		if (i == 2)
			EXPECT(nb < 14 && gain > 0.005,
			       "%s: merging pays, yet auto keeps %d buckets (%.2f%% gain)",
			       setups[i].what, nb, 100 * gain);
		if (i == 3) /* zero latency: merging saves nothing, and big buckets expose more */
			EXPECT(gain < 1e-9, "%s: merging should not pay, yet auto gains %.3g",
			       setups[i].what, gain);
	}
	/* deeper prefetch and deferral choices */
	check_setup(&setups[0], 2, 2, 0, true, NULL);
}

TEST_CASE(test_auto_memory_budget)
{
	const struct setup *x = &setups[0];
	struct sched naive;
	struct sched_cost_model cm;
	build(x, &naive, &cm);
	/* the range of peaks: per-block without prefetch vs everything in one bucket */
	double st;
	int64_t lo, hi;
	CHECK(manual(&naive, x, &cm, "per_block", 0, 0, 0, &st, &lo), "per_block");
	CHECK(manual(&naive, x, &cm, "embed+0+1+2+3+4+5+norm", 1, 1, 0, &st, &hi), "one");
	sched_cost_free(&cm);
	sched_free(&naive);
	fprintf(stderr, "  peaks: per-block no prefetch %lld, one bucket %lld bytes\n",
	        (long long)lo, (long long)hi);
	check_setup(x, 1, 1, lo + (hi - lo) / 4, true, NULL);
	check_setup(x, 1, 1, lo - 1, false, NULL);
}

/* The comm thread's CPU time (shared memory: it copies and sums; the cores are compute's):
 * with interference 1 compute repays all of it but what a WAIT's stall covered, and the step
 * grows by exactly what it repaid; with interference 0.5 half; 0 or no progress thread (the collective's time is already on the compute thread):
 * nothing. Checked on the per-block reordered 125M schedule over a fast link. */
TEST_CASE(test_comm_cpu_repaid)
{
	struct setup x = setups[4]; /* 125M, 800 Gb/s: no stalls */
	x.reshard = SCHED_RESHARD_DEFAULT;
	struct sched naive, s;
	struct sched_cost_model cm;
	build(&x, &naive, &cm);
	struct sched_reorder_opts o = {1, 1, 0};
	CHECK(sched_pipeline(&naive, x.ac, 0, "per_block", INT64_MAX / 4, &o, &cm, &s, NULL) == CT_OK,
	      "per-block schedule");
	struct sched_prediction p0, p1, ph, pz, pi;
	sched_predict(&s, &cm, &p0, NULL);
	cm.ag_cpu_bytes_s = cm.rs_cpu_bytes_s = 1e9; /* wire bytes at 1 GB/s of CPU */
	cm.ag_cpu_latency_s = cm.rs_cpu_latency_s = 1e-4;
	cm.interference = 1.0;
	sched_predict(&s, &cm, &p1, NULL);
	cm.interference = 0.5;
	sched_predict(&s, &cm, &ph, NULL);
	cm.interference = 0.0;
	sched_predict(&s, &cm, &pz, NULL);
	cm.interference = 1.0;
	cm.overlap = false;
	struct sched_prediction pi0;
	sched_predict(&s, &cm, &pi, NULL);
	cm.ag_cpu_bytes_s = cm.rs_cpu_bytes_s = 0;
	sched_predict(&s, &cm, &pi0, NULL);
	fprintf(stderr,
	        "  comm thread CPU %.4f s: step %.4f s without it, %.4f s (repaid %.4f s) at "
	        "interference 1, %.4f s (%.4f s) at 0.5\n",
	        p1.comm_cpu_s, p0.step_s, p1.step_s, p1.comm_cpu_paid_s, ph.step_s,
	        ph.comm_cpu_paid_s);
	EXPECT(p0.comm_cpu_s == 0 && p1.comm_cpu_s > 0.05 * p0.step_s,
	       "comm thread CPU %.4f s without rates, %.4f s with", p0.comm_cpu_s, p1.comm_cpu_s);
	EXPECT(p1.comm_cpu_paid_s <= p1.comm_cpu_s && p1.comm_cpu_paid_s > 0.99 * p1.comm_cpu_s &&
	           fabs(p1.step_s - (p0.step_s + p1.comm_cpu_paid_s)) < 1e-9,
	       "interference 1: step %.6f s, expected %.6f + %.6f s repaid of %.6f s", p1.step_s,
	       p0.step_s, p1.comm_cpu_paid_s, p1.comm_cpu_s);
	EXPECT(ph.comm_cpu_paid_s <= 0.5 * ph.comm_cpu_s &&
	           ph.comm_cpu_paid_s > 0.99 * 0.5 * ph.comm_cpu_s &&
	           fabs(ph.step_s - (p0.step_s + ph.comm_cpu_paid_s)) < 1e-9,
	       "interference 0.5: step %.6f s, repaid %.6f s of %.6f s", ph.step_s,
	       ph.comm_cpu_paid_s, ph.comm_cpu_s);
	EXPECT(pz.step_s == p0.step_s && pi.step_s == pi0.step_s && pi.comm_cpu_paid_s == 0,
	       "interference 0 (%.6f vs %.6f s) or inline (%.6f vs %.6f s) must not repay",
	       pz.step_s, p0.step_s, pi.step_s, pi0.step_s);
	sched_cost_free(&cm);
	sched_free(&s);
	sched_free(&naive);
}

/* One process (train_step, no FSDP): the prediction is compute plus zeroing the gradients,
 * their norm and AdamW; the schedule's collectives and their bucket copies cost nothing and
 * hold no gathered buffers (they cost 12% of the 125M step before, which train_step never
 * spends). */
TEST_CASE(test_single_process)
{
	struct setup x = setups[0];
	x.dp = 1;
	struct sched naive;
	struct sched_cost_model cm;
	build(&x, &naive, &cm);
	struct sched_prediction fsdp, one;
	sched_predict(&naive, &cm, &fsdp, NULL);
	cm.single = true;
	sched_predict(&naive, &cm, &one, NULL);
	double shard = 0;
	for (int b = 0; b < naive.n_buckets; b++)
		shard += (double)sched_bucket_shard(&naive, b);
	double expect = one.compute_s + shard * 4.0 / cm.mem_bytes_s +
	                (shard * 4.0 / cm.mem_bytes_s + 2.0 * cm.ag_latency_s) +
	                shard * SCHED_OPTIM_BYTES / cm.mem_bytes_s;
	fprintf(stderr,
	        "  1 process: predicted %.4f s (compute %.4f s; expected %.4f s); as a 1-rank "
	        "FSDP schedule %.4f s\n",
	        one.step_s, one.compute_s, expect, fsdp.step_s);
	EXPECT(fabs(one.step_s - expect) < 1e-9 * expect,
	       "1 process: predicted %.6f s, compute + zeroing + norm + AdamW %.6f s", one.step_s,
	       expect);
	EXPECT(one.comm_s == 0 && one.exposed_s == 0 && one.full_params_bytes == 0 &&
	           one.compute_s == fsdp.compute_s && fsdp.step_s > one.step_s,
	       "1 process: comm %g s, exposed %g s, gathered %lld bytes", one.comm_s, one.exposed_s,
	       (long long)one.full_params_bytes);
	sched_cost_free(&cm);
	sched_free(&naive);
}

/* Tensor parallelism: lowering turns every TP unit pass into its program (segments and TP
 * collectives in order), the validator rejects a program broken in any of four ways, and the
 * cost model prices a lowered schedule as the unlowered one (same step, TP time counted once
 * per collective; async rings below plain, above one ring step each). */
static void tp_units(struct sched_unit *u, int n, const struct llama_config *c, bool async,
                     int64_t B, int64_t T)
{
	for (int i = 0; i < n; i++)
		for (int p = 0; p < MODEL_PASS_COUNT; p++)
			llama_prog_descs_of(c,
			                    &(struct llama_prog_shape){
			                        .B = B, .T = T, .tp = 2, .cp = 1, .elem_bytes = 4,
			                        .async = async},
			                    MODEL_AC_FULL, i, (enum model_pass)p, &u[i].prog[p]);
}

static bool broken(const struct sched *lo, int at, int how, const char *want)
{
	struct sched b;
	sched_init_like(&b, lo);
	for (int i = 0; i < lo->n_nodes; i++) {
		struct sched_node n = lo->nodes[i];
		if (i == at && how == 0) /* drop it */
			continue;
		if (i == at && how == 2) /* the other collective */
			n.kind = n.kind == SCHED_TP_ALL_GATHER ? SCHED_TP_REDUCE_SCATTER
			                                       : SCHED_TP_ALL_GATHER;
		sched_push(&b, n);
		if (i == at && how == 1) { /* free the unit's parameters inside it */
			struct sched_node f = {.kind = SCHED_FREE,
			                       .unit = -1,
			                       .bucket = sched_bucket_of(lo, n.unit),
			                       .micro = n.micro,
			                       .phase = n.phase};
			sched_push(&b, f);
		}
	}
	if (how == 3) { /* a TP node in a schedule that says it is not lowered */
		b.lowered = false;
	}
	char why[256] = "";
	bool ok = sched_validate(&b, why, sizeof(why));
	sched_free(&b);
	EXPECT(!ok && strstr(why, want), "break %d at node %d: validate says %s (want '%s')", how,
	       at, ok ? "ok" : why, want);
	return !ok;
}

TEST_CASE(test_tp_lowering)
{
	struct setup x = setups[0];
	x.ac = MODEL_AC_FULL;
	struct llama_config c;
	CHECK(llama_config_preset(&c, x.flavor) == CT_OK, "preset");
	llama_config_finish(&c);
	struct param_table t;
	llama_table_build_tp(&t, &c, 2, 0);
	int U = t.n_units, M = 2;
	int64_t L = c.n_layers;
	struct sched_unit *u = calloc((size_t)U, sizeof(*u));
	sched_units_from_table(&t, x.dp, u);
	tp_units(u, U, &c, false, x.B, x.T);
	struct sched naive, ck, lo, again;
	sched_build(&naive, u, U, M, x.reshard);
	sched_pass_ac(&naive, MODEL_AC_FULL, 0, &ck);
	sched_lower_tp(&ck, &lo);
	sched_lower_tp(&lo, &again);
	char why[256] = "";
	EXPECT(sched_validate(&ck, why, sizeof(why)), "unlowered: %s", why);
	EXPECT(sched_validate(&lo, why, sizeof(why)), "lowered: %s", why);
	int64_t tp_nodes = 0;
	int first = -1;
	for (int i = 0; i < lo.n_nodes; i++) {
		enum sched_kind k = lo.nodes[i].kind;
		tp_nodes += k == SCHED_TP_ALL_GATHER || k == SCHED_TP_REDUCE_SCATTER;
		if (first < 0 && k == SCHED_FWD && lo.nodes[i].unit == 1)
			first = i;
	}
	/* per micro-batch: embedding 1 + 1, blocks 4 forward + 8 backward + 4 recomputed,
	 * head 2 + 2 */
	int64_t want = M * (2 + L * 16 + 4);
	EXPECT(tp_nodes == want && lo.n_nodes == ck.n_nodes + 2 * tp_nodes &&
	           again.n_nodes == lo.n_nodes,
	       "%lld TP nodes (want %lld), %d nodes lowered from %d, %d lowered twice",
	       (long long)tp_nodes, (long long)want, lo.n_nodes, ck.n_nodes, again.n_nodes);
	static const char *const seq[] = {"FWD u1.0",       "TP-AG u1 fwd.0", "FWD u1.1",
	                                  "TP-RS u1 fwd.1", "FWD u1.2",       "TP-AG u1 fwd.2",
	                                  "FWD u1.3",       "TP-RS u1 fwd.3", "FWD u1.4"};
	for (int k = 0; k < 9 && first >= 0; k++) {
		char lab[64];
		sched_node_label(&lo, first + k, lab, sizeof(lab));
		EXPECT(strcmp(lab, seq[k]) == 0, "node %d: %s, want %s", first + k, lab, seq[k]);
	}
	/* every way to break a program is caught */
	broken(&lo, first + 1, 0, "out of its unit's program");
	broken(&lo, first + 2, 1, "parameters freed inside the unit");
	broken(&lo, first + 3, 2, "another kind");
	broken(&lo, first + 1, 3, "not lowered");
	/* the cost model: the same step lowered or not; each collective priced once */
	struct sched_cost_model cm;
	struct model_config mc;
	*llama_cfg_init(&mc) = c;
	const struct model_cost_shape sh = {
	    .B = x.B, .T = x.T, .ac = MODEL_AC_FULL, .tp = 1, .elem_bytes = 4};
	sched_cost_init(&cm, &mc, &sh, &naive, x.dp, false);
	cm.matmul_flops = x.flops;
	cm.attn_flops = x.flops / 3;
	cm.mem_bytes_s = 2e10;
	cm.ag_latency_s = cm.rs_latency_s = x.lat_s;
	cm.ag_bytes_s = cm.rs_bytes_s = x.bytes_s;
	cm.overlap = false;
	cm.tp_latency_s = 20e-6;
	cm.tp_bytes_s = 1e9;
	struct sched_prediction pu, pl, pa;
	sched_predict(&ck, &cm, &pu, NULL);
	sched_predict(&lo, &cm, &pl, NULL);
	double sum = 0;
	for (int i = 0; i < lo.n_nodes; i++) {
		const struct sched_node *n = &lo.nodes[i];
		if (n->kind != SCHED_TP_ALL_GATHER && n->kind != SCHED_TP_REDUCE_SCATTER)
			continue;
		const struct model_coll_desc *d = &sched_node_prog(&lo, n)->c[n->seg];
		if (d->when != MODEL_COLL_IF_NOT_FUSED)
			sum += cm.tp_latency_s + (double)d->bytes / cm.tp_bytes_s;
	}
	fprintf(stderr, "  TP: step %.6f s unlowered, %.6f s lowered; TP %.6f s (sum %.6f s)\n",
	        pu.step_s, pl.step_s, pl.tp_s, sum);
	EXPECT(fabs(pu.step_s - pl.step_s) < 1e-9 * pu.step_s && pl.tp_s > 0 &&
	           fabs(pl.tp_s - sum) < 1e-9 * sum && fabs(pu.tp_s - sum) < 1e-9 * sum,
	       "TP pricing: step %.9f vs %.9f s, TP %.9f / %.9f s, sum %.9f s", pu.step_s,
	       pl.step_s, pu.tp_s, pl.tp_s, sum);
	tp_units(lo.units, U, &c, true, x.B, x.T); /* the same nodes, async programs */
	sched_predict(&lo, &cm, &pa, NULL);
	EXPECT(pa.tp_s < pl.tp_s && pa.tp_s >= sum / 2 - 1e-12,
	       "async TP %.6f s: not between one ring step each (%.6f) and plain (%.6f)", pa.tp_s,
	       sum / 2, pl.tp_s);
	sched_cost_free(&cm);
	sched_free(&naive), sched_free(&ck), sched_free(&lo), sched_free(&again);
	free(u);
	param_table_free(&t);
}

/* An expert-parallel program on every block's forward and backward: the dispatch posted, its
 * wait after the segment that runs beside it, the combine blocking (moe_ep_prog's shape). */
static void ep_units(struct sched_unit *u, int n, int64_t bytes, bool post, bool wait)
{
	for (int i = 1; i < n - 1; i++)
		for (int p = 0; p < 2; p++) { /* forward, backward */
			struct model_prog *g = &u[i].prog[p];
			const struct model_coll_desc a2a = {.kind = MODEL_COLL_ALL_TO_ALL,
			                                    .bytes = bytes,
			                                    .group = 2,
			                                    .role = MODEL_GROUP_EP,
			                                    .post = post};
			memset(g, 0, sizeof(*g));
			g->c[g->n++] = a2a;
			if (wait)
				g->c[g->n++] = (struct model_coll_desc){
				    .kind = MODEL_COLL_WAIT, .group = 2, .role = MODEL_GROUP_EP};
			g->c[g->n] = a2a;
			g->c[g->n++].post = false;
		}
}

TEST_CASE(test_ep_lowering)
{
	struct setup x = setups[0];
	struct llama_config c;
	CHECK(llama_config_preset(&c, x.flavor) == CT_OK, "preset");
	llama_config_finish(&c);
	struct param_table t;
	llama_table_build_tp(&t, &c, 1, 0);
	int U = t.n_units, M = 2;
	struct sched_unit *u = calloc((size_t)U, sizeof(*u));
	sched_units_from_table(&t, x.dp, u);
	const int64_t bytes = 1 << 20;
	ep_units(u, U, bytes, true, true);
	struct sched naive, lo;
	sched_build(&naive, u, U, M, x.reshard);
	sched_lower_tp(&naive, &lo);
	char why[256] = "";
	EXPECT(sched_validate(&lo, why, sizeof(why)), "lowered: %s", why);
	int a2a = 0, wait = 0;
	for (int i = 0; i < lo.n_nodes; i++) {
		a2a += lo.nodes[i].kind == SCHED_EP_ALL_TO_ALL;
		wait += lo.nodes[i].kind == SCHED_EP_WAIT;
	}
	int blocks = U - 2;
	EXPECT(wait == M * blocks * 2 && a2a == 2 * wait, "%d EP-A2A and %d EP-WAIT nodes (%d "
	       "blocks, %d micro-batches)", a2a, wait, blocks, M);
	/* a posted all-to-all never waited for, and a wait with nothing posted, are refused */
	const struct {
		bool post, wait;
		const char *want;
	} bad[] = {{true, false, "never waits for"}, {false, true, "no posted all-to-all"}};
	for (int k = 0; k < 2; k++) {
		struct sched_unit *v = calloc((size_t)U, sizeof(*v));
		memcpy(v, u, (size_t)U * sizeof(*v));
		ep_units(v, U, bytes, bad[k].post, bad[k].wait);
		struct sched nb, lb;
		sched_build(&nb, v, U, M, x.reshard);
		sched_lower_tp(&nb, &lb);
		bool ok = sched_validate(&lb, why, sizeof(why));
		EXPECT(!ok && strstr(why, bad[k].want), "validate says %s (want '%s')",
		       ok ? "ok" : why, bad[k].want);
		sched_free(&nb), sched_free(&lb);
		free(v);
	}
	/* the cost model: the posted dispatch hidden by the segment beside it, up to what that
	 * segment computes; blocking, every all-to-all exposed */
	struct sched_cost_model cm;
	struct model_config mc;
	*llama_cfg_init(&mc) = c;
	const struct model_cost_shape sh = {
	    .B = x.B, .T = x.T, .ac = MODEL_AC_NONE, .tp = 1, .elem_bytes = 4};
	sched_cost_init(&cm, &mc, &sh, &naive, x.dp, false);
	cm.matmul_flops = x.flops;
	cm.attn_flops = x.flops / 3;
	cm.mem_bytes_s = 2e10;
	cm.ag_latency_s = cm.rs_latency_s = x.lat_s;
	cm.ag_bytes_s = cm.rs_bytes_s = x.bytes_s;
	cm.overlap = false;
	cm.ep_latency_s = 20e-6;
	cm.ep_bytes_s = 1e9;
	struct sched_prediction pp, pb;
	sched_predict(&lo, &cm, &pp, NULL);
	ep_units(lo.units, U, bytes, false, true); /* the same nodes, the dispatch blocking */
	sched_predict(&lo, &cm, &pb, NULL);
	double one = cm.ep_latency_s + (double)bytes / cm.ep_bytes_s, wire = a2a * one;
	fprintf(stderr, "  EP: %d all-to-alls, %.6f s on the wire; exposed %.6f s posted, %.6f s "
	        "blocking; step %.6f vs %.6f s\n", a2a, pp.ep_comm_s, pp.ep_s, pb.ep_s,
	        pp.step_s, pb.step_s);
	EXPECT(fabs(pp.ep_comm_s - wire) < 1e-9 * wire && fabs(pb.ep_s - wire) < 1e-9 * wire &&
	           pp.ep_s < pb.ep_s - 1e-9 && pp.ep_s >= wire / 2 - 1e-12 &&
	           pp.step_s < pb.step_s && pp.n_ep == a2a,
	       "EP pricing: wire %.9f (want %.9f), exposed %.9f posted / %.9f blocking", pp.ep_comm_s,
	       wire, pp.ep_s, pb.ep_s);
	sched_cost_free(&cm);
	sched_free(&naive), sched_free(&lo);
	free(u);
	param_table_free(&t);
}

int main(void)
{
	test_seed();
	RUN(test_auto_beats_every_manual_plan);
	RUN(test_auto_memory_budget);
	RUN(test_single_process);
	RUN(test_comm_cpu_repaid);
	RUN(test_tp_lowering);
	RUN(test_ep_lowering);
	return test_summary();
}
