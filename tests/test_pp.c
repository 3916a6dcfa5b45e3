/* Pipeline parallelism under mpiexec (2, 4 and 8 ranks): a tiny Llama trained 5 steps with each
 * executable schedule equals a one-rank run of the same rows within 1e-5 relative on every
 * step's loss and gradient norm and on all parameters after the last step, and every
 * schedule equals GPipe within 1e-6:
 *  - 2 ranks: pp=2 with GPipe, 1F1B, Interleaved1F1B (2 stages per rank);
 *  - 4 ranks: pp=4 with the same three, pp=2 x dp_shard=2 (FSDP inside each stage) and
 *    pp=2 x dp_replicate=2 (HSDP replicas of a pipeline);
 *    and pp=2 x tp=2 (Megatron TP with sequence parallelism inside each stage);
 *  - 8 tiny ranks: pp=2 x dp_shard=2 x tp=2 (3D) and pp=2 x dp_replicate=2 x dp_shard=2;
 *  - the peak number of micro-batches in flight per rank equals the schedule's prediction
 *    (1F1B: p - r; GPipe: m);
 *  - ZB-H1 (backward split into input-gradient I and deferred weight-gradient W halves) on
 *    pp=2 and pp=4 like the others;
 *  - a CSV schedule (1F1B written and read back) runs like the generated one, and ZB-H1 on
 *    pp=2 x tp=2 (the split backward keeps TP's gathered activations) like the others;
 *  - validation (pp_eval_loss, the forward-only schedule) after every step, in every run
 *    above: the mean loss of held-out rows equals the one-rank forward's of the same rows
 *    within 1e-5 relative (the same fp32 forward, only the sum order of the loss differs),
 *    on every rank; and a run with validation trains bitwise as the same run without it
 *    (losses, gradient norms, parameters), with no slot or activation byte more.
 * --moe: a small deepseek_v3 mixture of experts (6 blocks, 5 of them MoE: 16 experts top-1,
 * the balancing bias at 1e-2 and the sequence-wise auxiliary loss on) instead, on 2 ranks
 * pp=2 with GPipe, 1F1B, Interleaved1F1B and ZB-H1, on 4 ranks pp=2 x dp_shard=2 (1F1B) and
 * pp=2 x dp_shard=2 with expert parallelism ep=2 (1F1B, Interleaved1F1B): each equals the
 * one-rank run on losses, gradient norms, validation and parameters within 1e-5, and on
 * the balancing bias after 5 steps within 1e-12 (each stage counts its own layers' tokens
 * over the step's micro-batches; the sum over the stages and data-parallel ranks updates
 * the whole model's bias, held by the state model, as one rank's step); a stage's slot
 * holds under 3/4 of a whole-model instance's activations (its units only).
 * Every rank computes the one-rank reference itself; every rank's verdict counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "data/synthetic.h"
#include "model/model.h"
#include "model/moe/moe.h"
#include "parallel/pp.h"
#include "parallel/tp.h"
#include "testutil.h"
#include "train/trainer.h"

#define STEPS 5
#define SEQ   16
#define MROWS 1 /* rows per micro-batch */
#define NMICRO 4

static uint64_t seed;
static bool moe;       /* --moe: the mixture of experts instead of Llama */
static int ep_deg = 1; /* the next pipeline run's expert parallelism (moe only) */

#define MAX_BIAS 128

static void config(struct model_config *mc)
{
	memset(mc, 0, sizeof(*mc));
	if (moe) {
		struct moe_config *c = moe_cfg_init(mc);
		CHECK(moe_config_preset(c, "deepseek_v3-debug") == CT_OK, "moe preset");
		c->vocab_size = 509;
		c->dim = 64;
		c->n_layers = 6; /* as Llama's: 6 + 2 splits into 2 and 4 stages */
		c->n_heads = 4;
		c->n_kv_heads = 2;
		c->inter_dim = 96;
		c->moe_inter_dim = 33;
		/* 16 experts, top-1: a micro-batch's or a stage's counts alone would move the
		 * bias otherwise than the whole step's */
		c->n_routed_experts = 16;
		c->top_k = 1;
		c->load_balance_coeff = 1e-2;
		c->aux_loss_alpha = 0.01;
		CHECK(moe_config_finish(c) == CT_OK, "moe config");
		return;
	}
	struct llama_config *lc = llama_cfg_init(mc);
	llama_config_preset(lc, "debugmodel");
	lc->n_layers = 6; /* 6 + 2 splits into 2, 4 and 8 stages */
	lc->dim = 64;
	lc->n_heads = 4;
	lc->n_kv_heads = 2;
	lc->vocab_size = 509;
	llama_config_finish(lc);
}

struct run {
	bool with_eval;       /* in: validate after every step */
	double eval[STEPS];   /* out: the validation losses */
	double loss[STEPS], norm[STEPS];
	float *params;
	/* memory (measured from MEM_ACTIVATIONS): the step's peak over what was there before
	 * pp_build, one slot of virtual stage 0, its slots, and its stage's blocks */
	int64_t act_peak, slot_bytes;
	int n_slots, blocks;
	double bias[MAX_BIAS]; /* --moe: the balancing bias after the run */
};

static void save_state(const struct model *m, struct run *out)
{
	int64_t n = model_state(m, NULL);
	CHECK(n <= MAX_BIAS, "state of %lld", (long long)n);
	memset(out->bias, 0, sizeof(out->bias));
	if (n > 0)
		model_state(m, out->bias);
}

/* The balancing bias moved somewhere: one expert's entry is a sum of +-coefficient steps
 * (0 where its load equals the mean), so it may be back at 0 after a few steps; all of
 * them 0 means the update did not run */
static bool bias_moved(const struct run *r)
{
	for (int i = 0; i < MAX_BIAS; i++)
		if (r->bias[i] != 0)
			return true;
	return false;
}

static void batch(int64_t step, int64_t micro_total, int32_t *tok, int32_t *tgt, int64_t vocab)
{
	synthetic_batch(seed, vocab, step * micro_total * MROWS, micro_total * MROWS, SEQ, tok, tgt);
}

/* The validation rows after step `step`: rows no training step reads. */
static void val_batch(int64_t step, int64_t micro_total, int32_t *tok, int32_t *tgt,
                      int64_t vocab)
{
	batch(1000 + step, micro_total, tok, tgt, vocab);
}

/* One rank, dp * NMICRO micro-batches per step (the same rows the layouts split). */
static void reference(int dp, struct run *out)
{
	struct model_config mc;
	config(&mc);
	struct model m;
	const struct model_build_opts o = {.own_params = true};
	model_build(&m, &mc, MROWS, SEQ, &o);
	model_init_params(&m, seed, m.params, 0, m.table->numel);
	struct adamw opt;
	adamw_init(&opt, m.table->numel, 0.9, 0.95, 1e-8, 0.1);
	int64_t acc = (int64_t)dp * NMICRO, n = acc * MROWS * SEQ;
	int32_t *tok = malloc((size_t)n * 4), *tgt = malloc((size_t)n * 4);
	for (int s = 0; s < STEPS; s++) {
		batch(s, acc, tok, tgt, model_config_vocab(&mc));
		struct train_step_result res;
		train_step(&m, &opt, tok, tgt, acc, 1e-3, 0.5, &res);
		out->loss[s] = res.loss;
		out->norm[s] = res.grad_norm;
		/* the validation loss: the one-rank forward of every validation micro-batch */
		val_batch(s, acc, tok, tgt, model_config_vocab(&mc));
		double sum = 0;
		int64_t valid = 0;
		model_set_loss_dscale(&m, 0);
		for (int64_t a = 0; a < acc; a++) {
			int64_t N = MROWS * SEQ, v = 0;
			memcpy(m.tokens, tok + a * N, (size_t)N * 4);
			memcpy(m.targets, tgt + a * N, (size_t)N * 4);
			sum += model_forward(&m, &v);
			valid += v;
		}
		out->eval[s] = sum / (double)valid;
	}
	out->params = malloc((size_t)m.table->numel * sizeof(float));
	memcpy(out->params, m.params, (size_t)m.table->numel * sizeof(float));
	save_state(&m, out);
	free(tok), free(tgt);
	adamw_free(&opt);
	model_free(&m);
}

/* A pipeline run on mesh (pp, rep, shard, tp); returns false if pp_build refused. */
static bool pipeline_tp(int pp_deg, int rep, int shard, int tp, enum pp_style style,
                        const char *csv, struct run *out, int *peak, int *predicted)
{
	struct mesh mesh;
	CHECK(mesh_build(&mesh, pp_deg, rep, shard, tp) == CT_OK, "mesh");
	CHECK(mesh_build_ep(&mesh, ep_deg) == CT_OK, "mesh ep");
	struct model_config mc;
	config(&mc);
	/* the family's state (MoE's bias) lives in a descriptive model, as the trainer's */
	struct tp_coll ep_coll;
	if (ep_deg > 1)
		tp_coll_init(&ep_coll, &mesh.ep_group, 0.0, 0.0, 60.0);
	struct model sm;
	const struct model_build_opts so = {.unit_hi = 1, .ep = ep_deg > 1 ? &ep_coll.ops : NULL};
	CHECK(model_build(&sm, &mc, MROWS, SEQ, &so) == CT_OK, "state model");
	struct pp_opts o = {.style = style,
	                    .csv = csv,
	                    .first_less = 1,
	                    .last_less = 1,
	                    .micro_rows = MROWS,
	                    .T = SEQ,
	                    .n_micro = NMICRO,
	                    .timeout_s = 60,
	                    .state_model = &sm};
	struct pp pp;
	mem_reset_peaks();
	int64_t act0 = mem_current(MEM_ACTIVATIONS);
	if (pp_build(&pp, &mc, &mesh, &o) != CT_OK) {
		pp_free(&pp);
		model_free(&sm);
		mesh_free(&mesh);
		return false;
	}
	pp_init_params(&pp, seed);
	struct adamw opt;
	adamw_init(&opt, pp.shard_numel, 0.9, 0.95, 1e-8, 0.1);
	struct engine e;
	pp_engine(&pp, &e);
	int dp = rep * shard, d = mesh.dp_group.rank;
	int64_t acc = (int64_t)dp * NMICRO, N = MROWS * SEQ;
	int32_t *tok = malloc((size_t)(acc * N) * 4), *tgt = malloc((size_t)(acc * N) * 4);
	int32_t *mt = malloc((size_t)(NMICRO * N) * 4), *mg = malloc((size_t)(NMICRO * N) * 4);
	for (int s = 0; s < STEPS; s++) {
		batch(s, acc, tok, tgt, model_config_vocab(&mc));
		for (int a = 0; a < NMICRO; a++) { /* the trainer's row layout: a * dp + d */
			memcpy(mt + a * N, tok + (a * dp + d) * N, (size_t)N * 4);
			memcpy(mg + a * N, tgt + (a * dp + d) * N, (size_t)N * 4);
		}
		struct train_step_result res;
		CHECK(engine_run(&e, mt, mg, NMICRO, &opt, 1e-3, 0.5, &res) == CT_OK, "step");
		out->loss[s] = res.loss;
		out->norm[s] = res.grad_norm;
		if (!out->with_eval)
			continue;
		val_batch(s, acc, tok, tgt, model_config_vocab(&mc));
		for (int a = 0; a < NMICRO; a++) {
			memcpy(mt + a * N, tok + (a * dp + d) * N, (size_t)N * 4);
			memcpy(mg + a * N, tgt + (a * dp + d) * N, (size_t)N * 4);
		}
		out->eval[s] = pp_eval_loss(&pp, mt, mg, NULL, NULL);
	}
	*peak = pp.peak_inflight;
	out->act_peak = mem_peak(MEM_ACTIVATIONS) - act0;
	out->slot_bytes = pp.vstages[0].slot_bytes;
	out->n_slots = 0;
	for (int c = 0; c < pp.v; c++)
		out->n_slots += pp.vstages[c].n_slots;
	out->blocks = 0;
	for (int u = pp.vstages[0].u0; u < pp.vstages[0].u1; u++)
		out->blocks += u >= 1 && u <= model_config_n_layers(&mc);
	*predicted = pp.sim.peak_inflight[pp.r];
	save_state(&sm, out);
	struct param_table global;
	model_table_build(&global, &mc);
	/* (under ep pp_gather_full writes the global layout) */
	int64_t nl = pp.table.numel > global.numel ? pp.table.numel : global.numel;
	float *local = malloc((size_t)nl * sizeof(float));
	pp_gather_full(&pp, local);
	out->params = malloc((size_t)global.numel * sizeof(float));
	if (tp > 1) /* the TP pieces into the one-rank layout */
		tp_gather_global(&mesh.tp_group, &pp.table, local, &global, out->params);
	else
		memcpy(out->params, local, (size_t)global.numel * sizeof(float));
	param_table_free(&global);
	free(local);
	free(tok), free(tgt), free(mt), free(mg);
	adamw_free(&opt);
	pp_free(&pp);
	model_free(&sm);
	mesh_free(&mesh);
	return true;
}

static bool pipeline(int pp_deg, int rep, int shard, enum pp_style style, const char *csv,
                     struct run *out, int *peak, int *predicted)
{
	return pipeline_tp(pp_deg, rep, shard, 1, style, csv, out, peak, predicted);
}

static double rel(double a, double b)
{
	return fabs(a - b) / fmax(fabs(b), 1e-30);
}

static int64_t n_params(void)
{
	struct model_config mc;
	config(&mc);
	struct param_table t;
	model_table_build(&t, &mc);
	int64_t n = t.numel;
	param_table_free(&t);
	return n;
}

static void compare(const char *what, const struct run *a, const struct run *b, double tol)
{
	double worst = 0;
	for (int s = 0; s < STEPS; s++) {
		worst = fmax(worst, rel(a->loss[s], b->loss[s]));
		worst = fmax(worst, rel(a->norm[s], b->norm[s]));
	}
	double perr = rel_err_f32(a->params, b->params, n_params());
	double berr = 0; /* the balancing bias (moe): sums of +-coefficient steps */
	for (int i = 0; i < MAX_BIAS; i++)
		berr = fmax(berr, fabs(a->bias[i] - b->bias[i]));
	EXPECT(worst <= tol && perr <= tol && berr <= 1e-12,
	       "%s rank %d: loss/norm rel err %.3g, params %.3g (tol %g), bias %.3g (tol 1e-12)",
	       what, comm_world_rank(), worst, perr, tol, berr);
	if (comm_world_rank() == 0)
		printf("  %-40s loss/norm %.2e  params %.2e  bias %.2e\n", what, worst, perr, berr);
}

/* Validation of a run against the one-rank reference's (tol relative, every rank's value). */
static void compare_eval(const char *what, const struct run *a, const struct run *ref,
                         double tol)
{
	double worst = 0;
	int at = 0;
	for (int s = 0; s < STEPS; s++)
		if (rel(a->eval[s], ref->eval[s]) > worst) {
			worst = rel(a->eval[s], ref->eval[s]);
			at = s;
		}
	EXPECT(worst <= tol, "%s rank %d: validation loss rel err %.3g (tol %g; after step %d: "
	       "%.9g vs %.9g)",
	       what, comm_world_rank(), worst, tol, at + 1, a->eval[at], ref->eval[at]);
	if (comm_world_rank() == 0)
		printf("  %-40s validation %.2e\n", what, worst);
}

/* Validation leaves training as it was: the same run without it, bitwise. */
static void compare_bitwise(const char *what, const struct run *a, const struct run *b)
{
	int64_t diff = 0, n = n_params();
	for (int s = 0; s < STEPS; s++)
		diff += a->loss[s] != b->loss[s] || a->norm[s] != b->norm[s];
	for (int64_t i = 0; i < n; i++)
		diff += memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0;
	EXPECT(diff == 0, "%s rank %d: with validation, %lld losses/norms/parameters differ from "
	       "the run without it",
	       what, comm_world_rank(), (long long)diff);
}

/* MEM_ACTIVATIONS of one whole-model micro-batch instance with L layers (no parameters). */
static int64_t full_slot_bytes(int64_t L)
{
	struct model_config mc;
	config(&mc);
	llama_cfg_mut(&mc)->n_layers = L;
	int64_t before = mem_current(MEM_ACTIVATIONS);
	struct model m;
	const struct model_build_opts o = {.own_params = false};
	CHECK(model_build(&m, &mc, MROWS, SEQ, &o) == CT_OK, "model");
	int64_t b = mem_current(MEM_ACTIVATIONS) - before;
	model_free(&m);
	return b;
}

/* Acceptance 3: the activations a rank holds at its peak are exactly the schedule's
 * predicted in-flight micro-batches times one stage slot, and a slot holds only its stage's
 * blocks: at most the whole model's minus the blocks of other stages (one more allowed: the
 * output boundary). */
static void check_memory(const char *what, const struct run *r, int pred, bool bound_check)
{
	struct model_config mc;
	config(&mc);
	int64_t L = llama_cfg(&mc)->n_layers, full = full_slot_bytes(L);
	int64_t block = full - full_slot_bytes(L - 1);
	int64_t bound = full - (L - r->blocks - 1) * block;
	EXPECT(r->n_slots == pred && r->act_peak == (int64_t)pred * r->slot_bytes,
	       "%s rank %d: %d slots, activation peak %lld bytes; predicted %d x %lld",
	       what, comm_world_rank(), r->n_slots, (long long)r->act_peak, pred,
	       (long long)r->slot_bytes);
	EXPECT(!bound_check || r->slot_bytes <= bound,
	       "%s rank %d: a slot of a %d-block stage holds %lld bytes, more than %lld (whole "
	       "model %lld, a block %lld)",
	       what, comm_world_rank(), r->blocks, (long long)r->slot_bytes, (long long)bound,
	       (long long)full, (long long)block);
	if (comm_world_rank() == 0)
		printf("  %-40s rank 0: %d in flight x %lld B = %lld B (whole-model instance %lld B)\n",
		       what, r->n_slots, (long long)r->slot_bytes, (long long)r->act_peak,
		       (long long)full);
}

TEST_CASE(equivalence)
{
	int W = comm_world_size();
	if (W > 4)
		return;
	static const enum pp_style styles[] = {PP_GPIPE, PP_1F1B, PP_INTERLEAVED_1F1B, PP_ZB_H1};
	struct run ref, gp;
	reference(1, &ref);
	for (int i = 0; i < 4; i++) {
		struct run r = {0};
		int peak = 0, pred = 0;
		char what[96];
		snprintf(what, sizeof(what), "pp=%d %s", W, pp_style_name(styles[i]));
		EXPECT(pipeline(W, 1, 1, styles[i], NULL, &r, &peak, &pred), "%s refused", what);
		compare(what, &r, &ref, 1e-5);
		EXPECT(peak == pred, "%s: rank %d held %d micro-batches, schedule predicts %d",
		       what, comm_world_rank(), peak, pred);
		if (styles[i] == PP_1F1B)
			EXPECT(peak == W - comm_world_rank(), "1F1B rank %d held %d, not p - r",
			       comm_world_rank(), peak);
		if (styles[i] == PP_GPIPE)
			EXPECT(peak == NMICRO, "GPipe rank %d held %d, not m", comm_world_rank(),
			       peak);
		if (styles[i] != PP_INTERLEAVED_1F1B)
			check_memory(what, &r, pred, styles[i] != PP_ZB_H1);
		struct run rv = {.with_eval = true};
		EXPECT(pipeline(W, 1, 1, styles[i], NULL, &rv, &peak, &pred), "%s refused", what);
		compare_eval(what, &rv, &ref, 1e-5);
		compare_bitwise(what, &rv, &r);
		/* validation reuses the step's slots: not one more, not a byte more at the peak */
		EXPECT(rv.n_slots == r.n_slots && rv.act_peak == r.act_peak,
		       "%s rank %d: with validation %d slots, activation peak %lld bytes; the step "
		       "alone %d, %lld",
		       what, comm_world_rank(), rv.n_slots, (long long)rv.act_peak, r.n_slots,
		       (long long)r.act_peak);
		free(rv.params);
		if (i == 0) {
			gp = r;
		} else {
			snprintf(what, sizeof(what), "pp=%d %s vs GPipe", W,
			         pp_style_name(styles[i]));
			compare(what, &r, &gp, 1e-6);
			free(r.params);
		}
	}
	free(gp.params);
	free(ref.params);
}

TEST_CASE(with_data_parallel)
{
	struct run ref, r = {.with_eval = true}; /* and validation */
	int peak = 0, pred = 0;
	if (comm_world_size() == 8) { /* 3D: pp x tp x dp_shard, and pp x dp_replicate x dp_shard */
		reference(2, &ref);
		EXPECT(pipeline_tp(2, 1, 2, 2, PP_1F1B, NULL, &r, &peak, &pred), "2x2x2 refused");
		compare("pp=2 x dp_shard=2 x tp=2 1F1B", &r, &ref, 1e-5);
		compare_eval("pp=2 x dp_shard=2 x tp=2 1F1B", &r, &ref, 1e-5);
		free(r.params);
		free(ref.params);
		reference(4, &ref);
		EXPECT(pipeline(2, 2, 2, PP_INTERLEAVED_1F1B, NULL, &r, &peak, &pred),
		       "2x2x2 refused");
		compare("pp=2 x dp_replicate=2 x dp_shard=2 Interleaved1F1B", &r, &ref, 1e-5);
		compare_eval("pp=2 x dp_replicate=2 x dp_shard=2 Interleaved1F1B", &r, &ref, 1e-5);
		free(r.params);
		free(ref.params);
		return;
	}
	if (comm_world_size() != 4)
		return;
	reference(2, &ref);
	EXPECT(pipeline(2, 1, 2, PP_1F1B, NULL, &r, &peak, &pred), "pp2 x shard2 refused");
	compare("pp=2 x dp_shard=2 1F1B", &r, &ref, 1e-5);
	compare_eval("pp=2 x dp_shard=2 1F1B", &r, &ref, 1e-5);
	free(r.params);
	EXPECT(pipeline(2, 2, 1, PP_INTERLEAVED_1F1B, NULL, &r, &peak, &pred),
	       "pp2 x rep2 refused");
	compare("pp=2 x dp_replicate=2 Interleaved1F1B", &r, &ref, 1e-5);
	compare_eval("pp=2 x dp_replicate=2 Interleaved1F1B", &r, &ref, 1e-5);
	free(r.params);
	free(ref.params);
	reference(1, &ref);
	EXPECT(pipeline_tp(2, 1, 1, 2, PP_INTERLEAVED_1F1B, NULL, &r, &peak, &pred),
	       "pp2 x tp2 refused");
	compare("pp=2 x tp=2 Interleaved1F1B", &r, &ref, 1e-5);
	compare_eval("pp=2 x tp=2 Interleaved1F1B", &r, &ref, 1e-5);
	free(r.params);
	free(ref.params);
}

TEST_CASE(csv_and_refusals)
{
	int W = comm_world_size();
	if (W > 4)
		return;
	char path[64];
	snprintf(path, sizeof(path), "/tmp/ct_pp_%llu.csv", (unsigned long long)seed);
	if (comm_world_rank() == 0) {
		struct pp_sched s;
		pp_sched_generate(&s, PP_1F1B, W, 1, NMICRO);
		pp_sched_write_csv(&s, path);
		pp_sched_free(&s);
	}
	struct mesh mesh;
	mesh_build(&mesh, 1, 1, -1, 1);
	comm_barrier(&mesh.world_group);
	struct run ref, r = {.with_eval = true}; /* and validation */
	int peak = 0, pred = 0;
	reference(1, &ref);
	EXPECT(pipeline(W, 1, 1, PP_GPIPE, path, &r, &peak, &pred), "CSV refused");
	compare("pp CSV (1F1B)", &r, &ref, 1e-5);
	compare_eval("pp CSV (1F1B)", &r, &ref, 1e-5);
	free(r.params);
	comm_barrier(&mesh.world_group);
	if (comm_world_rank() == 0)
		unlink(path);
	if (W == 4) { /* the split backward under TP: the gathered activations kept for W */
		EXPECT(pipeline_tp(2, 1, 1, 2, PP_ZB_H1, NULL, &r, &peak, &pred),
		       "pp2 x tp2 ZB-H1 refused");
		compare("pp=2 x tp=2 ZB-H1", &r, &ref, 1e-5);
		compare_eval("pp=2 x tp=2 ZB-H1", &r, &ref, 1e-5);
		free(r.params);
	}
	free(ref.params);
	mesh_free(&mesh);
}

/* --moe: the mixture of experts under every schedule on 2 ranks; with FSDP and with expert
 * parallelism inside it on 4 (each with validation) */
TEST_CASE(moe_stages)
{
	int W = comm_world_size();
	struct run ref;
	int peak = 0, pred = 0;
	char what[96];
	if (W == 2) {
		static const enum pp_style styles[] = {PP_GPIPE, PP_1F1B, PP_INTERLEAVED_1F1B,
		                                       PP_ZB_H1};
		reference(1, &ref);
		EXPECT(bias_moved(&ref), "the bias did not move");
		/* a whole-model instance's activations, against which a stage's slot is smaller */
		struct model_config mc;
		config(&mc);
		int64_t before = mem_current(MEM_ACTIVATIONS);
		struct model m;
		const struct model_build_opts mo = {.own_params = false};
		CHECK(model_build(&m, &mc, MROWS, SEQ, &mo) == CT_OK, "model");
		int64_t full = mem_current(MEM_ACTIVATIONS) - before;
		model_free(&m);
		for (int i = 0; i < 4; i++) {
			struct run r = {.with_eval = true};
			snprintf(what, sizeof(what), "moe pp=2 %s", pp_style_name(styles[i]));
			EXPECT(pipeline(2, 1, 1, styles[i], NULL, &r, &peak, &pred), "%s refused",
			       what);
			compare(what, &r, &ref, 1e-5);
			compare_eval(what, &r, &ref, 1e-5);
			/* a stage of 3 of the 6 blocks (or 1-2 interleaved) plans only its units */
			EXPECT(r.slot_bytes < full * 3 / 4,
			       "%s rank %d: a slot of %d blocks holds %lld activation bytes, the whole "
			       "model %lld",
			       what, comm_world_rank(), r.blocks, (long long)r.slot_bytes,
			       (long long)full);
			if (comm_world_rank() == 0)
				printf("  %-40s rank 0: a slot %lld B of the whole model's %lld B\n",
				       what, (long long)r.slot_bytes, (long long)full);
			free(r.params);
		}
		free(ref.params);
		return;
	}
	if (W != 4)
		return;
	reference(2, &ref);
	EXPECT(bias_moved(&ref), "the bias did not move");
	static const struct {
		int ep;
		enum pp_style style;
	} runs[] = {{1, PP_1F1B}, {2, PP_1F1B}, {2, PP_INTERLEAVED_1F1B}};
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		struct run r = {.with_eval = true};
		ep_deg = runs[i].ep;
		snprintf(what, sizeof(what), "moe pp=2 x dp_shard=2 x ep=%d %s", ep_deg,
		         pp_style_name(runs[i].style));
		EXPECT(pipeline(2, 1, 2, runs[i].style, NULL, &r, &peak, &pred), "%s refused", what);
		compare(what, &r, &ref, 1e-5);
		compare_eval(what, &r, &ref, 1e-5);
		free(r.params);
	}
	ep_deg = 1;
	free(ref.params);
}

int main(int argc, char **argv)
{
	comm_init(&argc, &argv);
	for (int i = 1; i < argc; i++)
		moe |= strcmp(argv[i], "--moe") == 0;
	seed = test_seed();
	int64_t s = comm_world_rank() == 0 ? (int64_t)(seed & 0x7fffffffffffull) : 0;
	struct mesh mesh;
	mesh_build(&mesh, 1, 1, -1, 1);
	comm_all_reduce_i64(&mesh.world_group, &s, 1); /* rank 0's seed everywhere */
	seed = (uint64_t)s;
	if (comm_world_rank() == 0)
		printf("seed used: %llu (CT_TEST_SEED=%llu reproduces it on rank 0)\n",
		       (unsigned long long)seed, (unsigned long long)seed);
	mesh_free(&mesh);
	if (moe) {
		RUN(moe_stages);
	} else {
		RUN(equivalence);
		RUN(with_data_parallel);
		RUN(csv_and_refusals);
	}
	int fails = test_summary();
	int64_t any = fails != 0;
	mesh_build(&mesh, 1, 1, -1, 1);
	comm_all_reduce_i64(&mesh.world_group, &any, 1);
	mesh_free(&mesh);
	comm_finalize();
	return any ? 1 : 0;
}
