/* Schedule tests under mpiexec (2 and 4 ranks):
 *  - every pass combination (activation checkpointing none/selective/full x bucketing
 *    per_block/manual/auto x reordering off/on, with the reshard policies and both comm
 *    progress modes cycled through) trains bitwise identically to the naive schedule —
 *    losses, gradient norms and all parameters after 3 steps of 2 micro-batches;
 *  - the passes' structure: bucket plans parse or are rejected, outputs validate, prefetch
 *    issues bucket k+1's all-gather before bucket k's forward, a memory budget holds;
 *  - activation checkpointing: full and selective cut activation memory by what the cost
 *    model predicts (within 10%) and give bitwise the same loss and gradients (1 process).
 *   test_schedule */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "comm/stream.h"
#include "model/model.h"
#include "data/synthetic.h"
#include "parallel/fsdp.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"
#include "testutil.h"
#include "train/trainer.h"

static struct mesh mesh;
static uint64_t seed;

/* A cost-model shape of one fp32 rank (before the B and T macros below). */
static struct model_cost_shape cost_shape(int64_t b, int64_t t, enum model_ac a)
{
	return (struct model_cost_shape){
	    .B = b, .T = t, .ac = a, .tp = 1, .elem_bytes = 4, .cp = 1};
}

#define STEPS 2
#define B     2
#define T     16
#define ACCUM 2

static void config(struct llama_config *c)
{
	llama_config_preset(c, "debugmodel");
	c->n_layers = 3;
	c->vocab_size = 509; /* rows not divisible by 2, 3 or 4: exercises padding */
	llama_config_finish(c);
}

/* A fixed cost model (every rank the same, no timing): auto bucketing is deterministic. */
static void fixed_cost(struct sched_cost_model *cm, const struct sched *s, enum model_ac ac)
{
	struct model_config c;
	config(llama_cfg_init(&c));
	const struct model_cost_shape sh = cost_shape(B, T, ac);
	sched_cost_init(cm, &c, &sh, s, mesh.dp_shard, false);
	cm->matmul_flops = cm->attn_flops = 2e10;
	cm->mem_bytes_s = 1e10;
	cm->ag_latency_s = cm->rs_latency_s = 5e-3; /* slow start-up: merging pays */
	cm->ag_bytes_s = cm->rs_bytes_s = 1e9;
}

struct run {
	double loss[STEPS], norm[STEPS];
	float *params;
};

static const char *const plans[] = {"per_block", "embed+0,1+2+norm", "auto"};

/* ac, plan index (-1: naive, no passes), reorder on/off, reshard, progress mode */
static void run(struct run *out, enum model_ac ac, int plan, bool reorder,
                enum fsdp_reshard reshard, enum stream_mode mode, char *desc, size_t dsize)
{
	struct llama_config c;
	config(&c);
	struct llama_model m;
	const struct llama_build_opts opts = {.own_params = false, .ac = ac};
	CHECK(llama_build_ex(&m, &c, B, T, &opts) == CT_OK, "build");
	struct comm_stream *stream = comm_stream_create(mode, 60);
	struct fsdp f;
	struct model mm; /* FSDP runs models through the family interface */
	model_wrap_llama(&mm, &m);
	fsdp_build(&f, &mm, &mesh, false, reshard, stream);
	fsdp_init_params(&f, seed);
	if (plan >= 0) {
		struct sched naive, s;
		fsdp_naive_schedule(&f, ACCUM, &naive);
		struct sched_cost_model cm;
		fixed_cost(&cm, &naive, ac);
		struct sched_reorder_opts o = {reorder ? 2 : 0, reorder ? 1 : 0, 0};
		CHECK(sched_pipeline(&naive, ac, 0, plans[plan], 64 << 20, &o, &cm, &s, NULL) == CT_OK,
		      "pipeline");
		EXPECT(fsdp_set_schedule(&f, &s) == CT_OK, "schedule rejected");
		char names[256] = "";
		for (int b = 0; b < s.n_buckets; b++) {
			char one[64];
			sched_bucket_name(&s, b, one, sizeof(one));
			snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
			         b ? "," : "", one);
		}
		snprintf(desc, dsize, "ac %s, buckets %s [%s], reorder %s, reshard %d, %s",
		         sched_ac_name(ac), plans[plan], names, reorder ? "on" : "off", reshard,
		         mode == STREAM_THREAD ? "thread" : "inline");
		sched_free(&naive);
		sched_free(&s);
		sched_cost_free(&cm);
	}
	struct adamw opt;
	adamw_init(&opt, f.shard_numel, 0.9, 0.95, 1e-8, 0.1);
	struct engine e;
	fsdp_engine(&f, &e);
	int32_t tok[ACCUM * B * T], tgt[ACCUM * B * T];
	int dp = mesh.dp_group.size, d = mesh.dp_group.rank;
	for (int st = 0; st < STEPS; st++) {
		for (int a = 0; a < ACCUM; a++)
			synthetic_batch(seed, c.vocab_size,
			                (int64_t)st * ACCUM * dp * B + ((int64_t)a * dp + d) * B, B,
			                T, tok + a * B * T, tgt + a * B * T);
		struct train_step_result r;
		CHECK(engine_run(&e, tok, tgt, ACCUM, &opt, 1e-3, 0.5, &r) == CT_OK, "step");
		out->loss[st] = r.loss;
		out->norm[st] = r.grad_norm;
	}
	out->params = malloc((size_t)m.table.numel * sizeof(float));
	fsdp_gather_full(&f, out->params);
	adamw_free(&opt);
	fsdp_free(&f);
	comm_stream_destroy(stream);
	llama_free(&m);
}

static int64_t numel(void)
{
	struct llama_config c;
	struct param_table t;
	config(&c);
	llama_table_build(&t, &c);
	int64_t n = t.numel;
	param_table_free(&t);
	return n;
}

TEST_CASE(test_pass_combinations_bitwise)
{
	struct run ref;
	char desc[512] = "naive";
	run(&ref, MODEL_AC_NONE, -1, false, FSDP_RESHARD_DEFAULT, STREAM_INLINE, desc,
	    sizeof(desc));
	int64_t n = numel();
	int k = 0;
	static const enum model_ac acs[] = {MODEL_AC_NONE, MODEL_AC_SELECTIVE, MODEL_AC_FULL};
	for (int a = 0; a < 3; a++)
		for (int p = 0; p < 3; p++)
			for (int r = 0; r < 2; r++, k++) {
				struct run x;
				run(&x, acs[a], p, r == 1, (enum fsdp_reshard)(k % 3),
				    k % 2 ? STREAM_THREAD : STREAM_INLINE, desc, sizeof(desc));
				bool same =
				    memcmp(x.params, ref.params, (size_t)n * sizeof(float)) == 0;
				for (int s = 0; s < STEPS; s++)
					same = same && x.loss[s] == ref.loss[s] &&
					       x.norm[s] == ref.norm[s];
				if (mesh.rank == 0)
					fprintf(stderr, "  %-90s %s\n", desc,
					        same ? "bitwise equal" : "DIFFERS");
				EXPECT(
				    same,
				    "%s: not bitwise equal to the naive step (loss %.9g vs %.9g)",
				    desc, x.loss[STEPS - 1], ref.loss[STEPS - 1]);
				free(x.params);
			}
	free(ref.params);
}

/* ---------------------------------------------------------------- structure (rank 0) */

static void naive_sched(struct sched *s, enum sched_reshard reshard, int micro)
{
	struct llama_config c;
	struct param_table t;
	config(&c);
	llama_table_build(&t, &c);
	struct sched_unit *u = calloc((size_t)t.n_units, sizeof(*u));
	sched_units_from_table(&t, 4, u);
	sched_build(s, u, t.n_units, micro, reshard);
	free(u);
	param_table_free(&t);
}

TEST_CASE(test_bucket_plans)
{
	static const char *const good[] = {"per_block", "embed,0,1,2,norm", "embed+0+1+2+norm",
	                                   "embed+0, 1+2 ,norm", "embed,0+1+2+output"};
	static const char *const bad[] = {"",
	                                  "embed",
	                                  "embed,1,0,2,norm",
	                                  "0,embed",
	                                  "embed,0,1,2",
	                                  "embed,0,1,2,3,norm",
	                                  "embed,,0,1,2,norm",
	                                  "embed,x,norm",
	                                  "embed+0+0,1,2,norm"};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct sched_bucket *b;
		int nb;
		char why[256];
		EXPECT(sched_bucket_plan_parse(good[i], 5, &b, &nb, why, sizeof(why)) == CT_OK,
		       "'%s' rejected: %s", good[i], why);
		if (i == 0)
			EXPECT(nb == 5, "per_block: %d buckets", nb);
		free(b);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct sched_bucket *b = NULL;
		int nb;
		char why[256] = "";
		EXPECT(sched_bucket_plan_parse(bad[i], 5, &b, &nb, why, sizeof(why)) ==
		           CT_ERR_USAGE,
		       "'%s' accepted", bad[i]);
		EXPECT(why[0], "'%s': no reason given", bad[i]);
	}
}

TEST_CASE(test_passes_structure)
{
	char why[256];
	for (int r = 0; r < 3; r++)
		for (int micro = 1; micro <= 2; micro++) {
			struct sched s, ck, bk, ro;
			naive_sched(&s, (enum sched_reshard)r, micro);
			EXPECT(sched_validate(&s, why, sizeof(why)), "naive: %s", why);
			sched_pass_ac(&s, MODEL_AC_FULL, 0, &ck);
			EXPECT(sched_validate(&ck, why, sizeof(why)), "checkpoint: %s", why);
			struct sched_bucket plan[3] = {{0, 2}, {2, 1}, {3, 2}};
			sched_pass_bucket(&ck, plan, 3, &bk);
			EXPECT(sched_validate(&bk, why, sizeof(why)), "bucket: %s", why);
			struct sched_reorder_opts o = {1, 1, 0};
			sched_pass_reorder(&bk, &o, NULL, &ro);
			EXPECT(sched_validate(&ro, why, sizeof(why)), "reorder: %s", why);
			EXPECT(ro.n_nodes == bk.n_nodes, "reorder changed the node count");
			/* prefetch 1: bucket k+1's forward all-gather is issued before bucket k's
			 * first forward unit, for k >= 1 */
			for (int k = 1; k + 1 < ro.n_buckets; k++) {
				int ag = -1, fwd = -1;
				for (int i = 0; i < ro.n_nodes; i++) {
					const struct sched_node *n = &ro.nodes[i];
					if (n->micro || n->phase != SCHED_PH_FWD)
						continue;
					if (n->kind == SCHED_ALL_GATHER && n->bucket == k + 1 &&
					    ag < 0)
						ag = i;
					if (n->kind == SCHED_FWD && n->unit == ro.buckets[k].unit0)
						fwd = i;
				}
				EXPECT(ag >= 0 && ag < fwd,
				       "reshard %d: AG b%d at %d, FWD of b%d at %d", r, k + 1, ag,
				       k, fwd);
			}
			/* RECOMPUTE right before every block's backward, and the recomputed
			 * all-gathers flagged */
			int rec = 0, bwd_blocks = 0, reg = 0;
			for (int i = 0; i < ro.n_nodes; i++) {
				rec += ro.nodes[i].kind == SCHED_RECOMPUTE;
				bwd_blocks += ro.nodes[i].kind == SCHED_BWD &&
				              ro.units[ro.nodes[i].unit].is_block;
				reg +=
				    ro.nodes[i].kind == SCHED_ALL_GATHER && ro.nodes[i].recompute;
			}
			EXPECT(rec == bwd_blocks, "%d recomputes for %d block backwards", rec,
			       bwd_blocks);
			if (r == SCHED_RESHARD_NEVER)
				EXPECT(reg == 0, "never reshards, yet %d re-gathers", reg);
			else
				EXPECT(reg >= micro * 2, "reshard %d: %d re-gathers", r, reg);
			sched_free(&s), sched_free(&ck), sched_free(&bk), sched_free(&ro);
		}
}

TEST_CASE(test_memory_budget)
{
	/* deeper prefetch costs receive buffers; a budget between the two peaks is kept */
	struct sched s, deep, shallow, fit;
	naive_sched(&s, SCHED_RESHARD_ALWAYS, 1);
	struct sched_cost_model cm;
	fixed_cost(&cm, &s, MODEL_AC_NONE);
	struct sched_reorder_opts o0 = {0, 0, 0}, o3 = {3, 1, 0};
	sched_pass_reorder(&s, &o0, &cm, &shallow);
	sched_pass_reorder(&s, &o3, &cm, &deep);
	struct sched_prediction p0, p3, pf;
	sched_predict(&shallow, &cm, &p0, NULL);
	sched_predict(&deep, &cm, &p3, NULL);
	EXPECT(p3.peak_bytes > p0.peak_bytes, "prefetch 3 peak %lld <= prefetch 0 peak %lld",
	       (long long)p3.peak_bytes, (long long)p0.peak_bytes);
	EXPECT(p3.exposed_s <= p0.exposed_s, "prefetch exposes more (%g > %g)", p3.exposed_s,
	       p0.exposed_s);
	struct sched_reorder_opts ob = {3, 1, (p0.peak_bytes + p3.peak_bytes) / 2};
	sched_pass_reorder(&s, &ob, &cm, &fit);
	sched_predict(&fit, &cm, &pf, NULL);
	fprintf(stderr, "  peak: prefetch 0 %lld, prefetch 3 %lld, budget %lld -> %lld bytes\n",
	        (long long)p0.peak_bytes, (long long)p3.peak_bytes, (long long)ob.memory_bytes,
	        (long long)pf.peak_bytes);
	EXPECT(pf.peak_bytes <= ob.memory_bytes, "budget not kept");
	char why[256];
	EXPECT(sched_validate(&fit, why, sizeof(why)), "%s", why);
	sched_free(&s), sched_free(&deep), sched_free(&shallow), sched_free(&fit);
	sched_cost_free(&cm);
}

TEST_CASE(test_checkpoint_memory)
{
	/* one process, own parameters: activation memory per mode vs the cost model's
	 * prediction, and bitwise equal loss and gradients. Five blocks, so that per-layer
	 * checkpointing of every second one (blocks 2 and 4) saves a block's worth: with one
	 * checkpointed block the shared recompute buffers cost what the block saves. */
	struct llama_config c;
	config(&c);
	c.n_layers = 5;
	int64_t Bm = 2, Tm = 256;
	enum { NM = 4 };
	static const enum model_ac modes[NM] = {MODEL_AC_NONE, MODEL_AC_SELECTIVE, MODEL_AC_FULL,
	                                        MODEL_AC_LAYER};
	static const int every[NM] = {0, 0, 0, 2};
	int64_t measured[NM], predicted[NM];
	double loss[NM];
	float *grads[NM];
	int64_t n = 0;
	float *params = NULL;
	int32_t *tok = malloc((size_t)(Bm * Tm) * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)(Bm * Tm) * sizeof(int32_t));
	synthetic_batch(seed, c.vocab_size, 0, Bm, Tm, tok, tgt);
	for (int i = 0; i < NM; i++) {
		int64_t before = mem_current(MEM_ACTIVATIONS);
		struct llama_model m;
		const struct llama_build_opts opts = {
		    .own_params = true, .ac = modes[i], .ac_every = every[i]};
		CHECK(llama_build_ex(&m, &c, Bm, Tm, &opts) == CT_OK, "build");
		measured[i] = mem_current(MEM_ACTIVATIONS) - before;
		struct model_config mc;
		*llama_cfg_init(&mc) = c;
		struct model_cost_shape sh = cost_shape(Bm, Tm, modes[i]);
		sh.ac_every = every[i];
		predicted[i] = model_cost_activation_bytes(&mc, &sh);
		n = m.table.numel;
		if (!params) {
			params = malloc((size_t)n * sizeof(float));
			llama_init_params(&m.cfg, &m.table, seed, params, 0, n);
		}
		memcpy(m.params, params, (size_t)n * sizeof(float));
		memcpy(m.tokens, tok, (size_t)(Bm * Tm) * sizeof(int32_t));
		memcpy(m.targets, tgt, (size_t)(Bm * Tm) * sizeof(int32_t));
		loss[i] = llama_forward(&m, NULL);
		llama_backward(&m, 1e-3);
		grads[i] = malloc((size_t)n * sizeof(float));
		memcpy(grads[i], m.grads, (size_t)n * sizeof(float));
		llama_free(&m);
	}
	for (int i = 1; i < NM; i++) {
		double cut = (double)(measured[0] - measured[i]);
		double want = (double)(predicted[0] - predicted[i]);
		fprintf(stderr,
		        "  %-9s activations %.2f MiB (none %.2f MiB): saves %.2f MiB, cost model "
		        "predicts %.2f MiB (%+.1f%%)\n",
		        sched_ac_name(modes[i]), measured[i] / 1048576.0, measured[0] / 1048576.0,
		        cut / 1048576.0, want / 1048576.0, 100.0 * (cut - want) / want);
		EXPECT(cut > 0 && fabs(cut - want) <= 0.10 * want, "%s: saves %.0f, predicted %.0f",
		       sched_ac_name(modes[i]), cut, want);
		EXPECT(loss[i] == loss[0], "%s: loss %.9g vs %.9g", sched_ac_name(modes[i]),
		       loss[i], loss[0]);
		EXPECT(memcmp(grads[i], grads[0], (size_t)n * sizeof(float)) == 0,
		       "%s: gradients differ", sched_ac_name(modes[i]));
	}
	/* every second block keeps only its input: less than none, more than full */
	EXPECT(measured[3] < measured[0] && measured[3] > measured[2],
	       "per-layer: %lld bytes, none %lld, full %lld", (long long)measured[3],
	       (long long)measured[0], (long long)measured[2]);
	for (int i = 0; i < NM; i++)
		free(grads[i]);
	free(params), free(tok), free(tgt);
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	CHECK(mesh_build(&mesh, 1, 1, -1, 1) == CT_OK, "mesh");
	seed = test_seed_all(&mesh.world_group);
	if (mesh.rank == 0) {
		fprintf(stderr, "world %d\n", mesh.world);
		RUN(test_bucket_plans);
		RUN(test_passes_structure);
		RUN(test_memory_budget);
		RUN(test_checkpoint_memory);
	}
	RUN(test_pass_combinations_bitwise);
	int rc = test_summary_all(&mesh.world_group);
	mesh_free(&mesh);
	comm_finalize();
	return rc;
}
